"""How a family's layers are served by the exported decoder (paddle_vha/export/decoder.py), as data: `Serving`, one
per family (the registry's `serving_ref`), and the stock GQA layer's form every other form derives from.

A stock Qwen3 (GQA) layer's cache holds the n_kv KV heads of width d as a key and a value tensor; queries, keys,
values and outputs pass unchanged. A family whose layers differ at serving time gives its own `build` (Qwen3-MEA's
multi-query form, shared-KV's one cache tensor). Tensors the serving form carries as graph constants are named by the
spec (`Param(serve=attribute)`, e.g. the window layers' sink logits): `Family.export_form` puts each on the form, so
Qwen3 with sinks is the GQA form with no code of its own."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Tuple

__all__ = ["GQAForm", "Serving", "GQA", "STOCK_QWEN3", "gqa_cache_shape", "gqa_refusal"]


class GQAForm:
    """One GQA layer in the exported decoder."""

    kv_projections = ("k_proj", "v_proj")  # the Linears that make keys (normed and rotated) and values
    cache_names = ("key", "value")  # its past_key_values.{i}.* / present.{i}.* tensors
    sinks = None  # a sink logit per query head added to the softmax (set from the spec where a layer has them)

    def __init__(self, num_kv_heads: int, head_dim: int):
        self.kv_heads = num_kv_heads  # heads the projections emit
        self.cache_shape = (num_kv_heads, head_dim)  # (heads, width) of each of this layer's past / present tensors

    @classmethod
    def build(cls, cfg, layer_idx: int, tensors, const) -> "GQAForm":
        return cls(*gqa_cache_shape(cfg, layer_idx))

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


def gqa_cache_shape(cfg, layer_idx: int) -> tuple:
    return (cfg.num_key_value_heads, cfg.head_dim)


def gqa_refusal(cfg) -> Optional[str]:
    if cfg.num_attention_heads % cfg.num_key_value_heads:
        return (f"num_attention_heads {cfg.num_attention_heads} is not a multiple of num_key_value_heads "
                f"{cfg.num_key_value_heads}")
    return None


@dataclass(frozen=True)
class Serving:
    """A family's layers in the exported decoder.

    build(cfg, i, tensors, const)  layer i's form (GQAForm's members); `const` makes a graph constant of an array
    cache_shape(cfg, i)            (heads, width) of each of layer i's cache tensors
    cache_names                    their names, ("key", "value") or ("key",)
    refusal(cfg)                   why a checkpoint cannot be exported as it is, or None
    genai_model_type               onnxruntime-genai's decoder type that runs the exports (paddle_vha/export/genai.py)
    """

    build: Callable = GQAForm.build
    cache_shape: Callable = gqa_cache_shape
    cache_names: Tuple[str, ...] = GQAForm.cache_names
    refusal: Callable = gqa_refusal
    genai_model_type: Optional[str] = None


GQA = Serving()  # a GQA layer as it is (Qwen3 with sinks: the sinks come from its spec)
STOCK_QWEN3 = Serving(genai_model_type="qwen3")  # stock Qwen3, which genai's qwen3 decoder runs
