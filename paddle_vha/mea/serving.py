"""How Qwen3-MEA is served by the exported decoder (paddle_vha/export/decoder.py): MEA layers in the multi-query
serving form (paddle_vha/mea/functional.py), layers MEA left alone as stock GQA with their own KV heads.

An MEA layer caches ONE wide KV head, its n_p physical heads side by side, (B, 1, T, n_p*d); the K-side HLC
coefficients are absorbed into each query head and the V-side ones applied after attention, then the head norm. The
form needs k_norm on the cached physical heads ('before_hlc').
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import paddle

from ..qwen3.serving import GQAForm, Serving
from .functional import apply_value_coefficients, head_rms_norm, query_coefficients, wide_kv_head, widen_queries

__all__ = ["MEAServingForm", "MEA", "export_form", "cache_shape", "export_refusal"]


class MEAServingForm(GQAForm):
    """One MEA layer in the exported decoder: qwen3.serving.GQAForm's members, with one wide head."""

    def __init__(self, cfg, layer_idx: int, tensors, const):
        p = f"model.layers.{layer_idx}.self_attn."
        n_p, groups = cfg.num_key_value_heads, cfg.num_attention_heads // cfg.mea_kv_heads
        self.kv_heads = n_p  # k_proj / v_proj emit the physical heads
        self.cache_shape = cache_shape(cfg, layer_idx)  # one wide head
        with paddle.no_grad():  # per-query-head coefficients, constants of the graph: coef[i, p] = lc[p, i // groups]
            self.coef_k, self.coef_v = (
                const(query_coefficients(paddle.to_tensor(np.asarray(tensors[p + f"mea_{side}_lc"], np.float32)),
                                         groups).numpy())
                for side in ("k", "v"))
        self.norm = const(tensors[p + "mea_norm.weight"]) if cfg.mea_group_norm else None
        self.eps = float(cfg.rms_norm_eps)

    def to_cache(self, k, v):
        """(B, S, n_p, d) each -> one wide head (B, 1, S, n_p*d)."""
        return [wide_kv_head(k.transpose([0, 2, 1, 3])), wide_kv_head(v.transpose([0, 2, 1, 3]))]

    def queries(self, q):
        """(B, H, S, d) -> (B, H, S, n_p*d): the K-side HLC coefficients absorbed into every query head."""
        return widen_queries(q, self.coef_k)

    def output(self, y, cos, sin):
        """(B, S, H, n_p*d) -> (B, S, H, d): V-side HLC, then the head norm."""
        y = apply_value_coefficients(y, self.coef_v)
        return y if self.norm is None else head_rms_norm(y, self.norm, self.eps)


def export_form(cfg, layer_idx: int, tensors, const):
    if cfg.is_mea_layer(layer_idx):
        return MEAServingForm(cfg, layer_idx, tensors, const)
    return GQAForm(*cache_shape(cfg, layer_idx))  # a layer MEA left alone


def cache_shape(cfg, layer_idx: int) -> tuple:
    """(1, n_p*d) for an MEA layer (one wide head); (n_s, d) for a stock layer."""
    if cfg.is_mea_layer(layer_idx):
        return (1, cfg.num_key_value_heads * cfg.head_dim)
    return (cfg.mea_stock_kv_heads, cfg.head_dim)


def export_refusal(cfg) -> Optional[str]:
    if cfg.mea_layer_indices and cfg.mea_k_norm_position != "before_hlc":
        return (f"mea_k_norm_position={cfg.mea_k_norm_position!r}: the ONNX export uses the multi-query serving form, "
                "which needs 'before_hlc' (compress with tools/compress_kv.py --k-norm before)")
    return None


MEA = Serving(build=export_form, cache_shape=cache_shape, refusal=export_refusal)
