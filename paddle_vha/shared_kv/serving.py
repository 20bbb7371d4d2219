"""How Qwen3 shared-KV is served by the exported decoder (paddle_vha/export/decoder.py): each layer caches ONE tensor,
`past_key_values.{i}.key` -> `present.{i}.key` (B, H_kv, T, d), the normed and rotated shared projection, which
attention reads as keys and as values; the output is rotated back by the query's angle (inverse RoPE in the graph)."""
from __future__ import annotations

from typing import Optional

from ..qwen3.functional import inverse_rope
from ..qwen3.serving import GQAForm
from ..qwen3.serving import export_refusal as stock_refusal
from ..sinks.spec import SINKS
from .spec import KV_PROJECTIONS

__all__ = ["SharedKVForm", "export_form", "cache_shape", "cache_names", "export_refusal"]


class SharedKVForm(GQAForm):
    kv_projections = KV_PROJECTIONS  # the one projection the spec declares for both keys and values
    cache_names = ("key",)

    def to_cache(self, k, v):
        """(B, S, H_kv, d) rotated shared projection -> its one cache entry (B, H_kv, S, d)."""
        return [k.transpose([0, 2, 1, 3])]

    def attention_kv(self, cached):
        return cached[0], cached[0]  # K = V

    def output(self, y, cos, sin):
        return inverse_rope(y, cos, sin)  # R(-theta s) at the query positions


def export_form(cfg, layer_idx: int, tensors, const) -> SharedKVForm:
    form = SharedKVForm(*cache_shape(cfg, layer_idx))
    if cfg.has_sinks(layer_idx):  # a window layer's sink logits (H,), a constant of the graph
        form.sinks = const(tensors[f"model.layers.{layer_idx}.{SINKS}"])
    return form


def cache_shape(cfg, layer_idx: int) -> tuple:
    return (cfg.num_key_value_heads, cfg.head_dim)


def cache_names(cfg, layer_idx: int) -> tuple:
    return SharedKVForm.cache_names


def export_refusal(cfg) -> Optional[str]:
    return stock_refusal(cfg)
