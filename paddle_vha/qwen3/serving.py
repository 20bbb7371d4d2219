"""How a stock Qwen3 (GQA) layer is served by the exported decoder (paddle_vha/export/decoder.py): its cache holds
the n_kv KV heads of width d as a key and a value tensor; queries, keys, values and outputs pass unchanged. A family
whose layers differ at serving time (Qwen3-MEA's multi-query form, shared-KV's one cache tensor) provides its own form
with the same members."""
from __future__ import annotations

from typing import Optional

__all__ = ["GQAForm", "export_form", "cache_shape", "cache_names", "export_refusal", "GENAI_MODEL_TYPE"]

GENAI_MODEL_TYPE = "qwen3"  # onnxruntime-genai's decoder for this family's exports (paddle_vha/export/genai.py)


class GQAForm:
    """One GQA layer in the exported decoder."""

    kv_projections = ("k_proj", "v_proj")  # the Linears that make keys (normed and rotated) and values
    cache_names = ("key", "value")  # its past_key_values.{i}.* / present.{i}.* tensors
    sinks = None  # a sink logit per query head added to the softmax (Qwen3 with sinks' window layers), or None

    def __init__(self, num_kv_heads: int, head_dim: int):
        self.kv_heads = num_kv_heads  # heads the projections emit
        self.cache_shape = (num_kv_heads, head_dim)  # (heads, width) of each of this layer's past / present tensors

    def to_cache(self, k, v):
        """(B, S, n_kv, d) rotated keys and values -> the new cache entries, (B, n_kv, S, d) each."""
        return [k.transpose([0, 2, 1, 3]), v.transpose([0, 2, 1, 3])]

    def attention_kv(self, cached):
        """The whole cache (past and new) -> (keys, values) attention reads."""
        return cached[0], cached[1]

    def queries(self, q):
        """(B, H, S, d) rotated queries -> what attention multiplies with the cached keys."""
        return q

    def output(self, y, cos, sin):
        """(B, S, H, width) attention output -> (B, S, H, d), the input of o_proj; cos / sin (B, S, 1, d) of the
        queries' positions."""
        return y


def export_form(cfg, layer_idx: int, tensors, const) -> GQAForm:
    return GQAForm(*cache_shape(cfg, layer_idx))


def cache_shape(cfg, layer_idx: int) -> tuple:
    return (cfg.num_key_value_heads, cfg.head_dim)


def cache_names(cfg, layer_idx: int) -> tuple:
    return GQAForm.cache_names


def export_refusal(cfg) -> Optional[str]:
    if cfg.num_attention_heads % cfg.num_key_value_heads:
        return (f"num_attention_heads {cfg.num_attention_heads} is not a multiple of num_key_value_heads "
                f"{cfg.num_key_value_heads}")
    return None
