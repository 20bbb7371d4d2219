"""How a stock Qwen3 (GQA) layer is served by the exported decoder (paddle_vha/export/decoder.py): its cache holds
the n_kv KV heads of width d; queries, keys, values and outputs pass unchanged. A family whose layers differ at
serving time (Qwen3-MEA's multi-query form) provides its own form with the same four members."""
from __future__ import annotations

from typing import Optional

from .contract import sliding_window_layers

__all__ = ["GQAForm", "export_form", "cache_shape", "export_refusal"]


class GQAForm:
    """One GQA layer in the exported decoder."""

    def __init__(self, num_kv_heads: int, head_dim: int):
        self.kv_heads = num_kv_heads  # heads k_proj / v_proj emit
        self.cache_shape = (num_kv_heads, head_dim)  # (heads, width) of this layer's past / present tensors

    def keys_values(self, k, v):
        """(B, S, n_kv, d) each -> the cached layout (B, n_kv, S, d)."""
        return k.transpose([0, 2, 1, 3]), v.transpose([0, 2, 1, 3])

    def queries(self, q):
        """(B, H, S, d) rotated queries -> what attention multiplies with the cached keys."""
        return q

    def output(self, y):
        """(B, S, H, width) attention output -> (B, S, H, d), the input of o_proj."""
        return y


def export_form(cfg, layer_idx: int, tensors, const) -> GQAForm:
    return GQAForm(*cache_shape(cfg, layer_idx))


def cache_shape(cfg, layer_idx: int) -> tuple:
    return (cfg.num_key_value_heads, cfg.head_dim)


def export_refusal(cfg) -> Optional[str]:
    windows = sliding_window_layers(cfg)
    if windows:
        return (f"sliding-window layers {windows} (sliding_window={cfg.sliding_window}) are not supported by the export "
                "(its decoder attends to the whole cache)")
    if cfg.num_attention_heads % cfg.num_key_value_heads:
        return (f"num_attention_heads {cfg.num_attention_heads} is not a multiple of num_key_value_heads "
                f"{cfg.num_key_value_heads}")
    return None
