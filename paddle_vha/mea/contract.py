"""The Qwen3-MEA tensor contract (docs/mea.md): stock Qwen3 names; MEA layers have n_p-head k_proj / v_proj and the HLC
coefficients."""
from __future__ import annotations

from ..checkpoint.contract import Shapes
from ..qwen3.contract import layer_prefix
from ..qwen3.contract import tensor_shapes as qwen3_tensor_shapes

__all__ = ["tensor_shapes"]


def tensor_shapes(cfg) -> Shapes:
    """Qwen3-MEA tensor names -> HF-layout shapes.

    MEA layers have n_p-head k_proj / v_proj and mea_k_lc, mea_v_lc [n_p, n_v] (+ mea_norm.weight [H*d] with
    mea_group_norm); stock layers have mea_stock_kv_heads-head k_proj / v_proj.
    """
    shapes = qwen3_tensor_shapes(cfg)  # k/v sized by num_key_value_heads = n_p; fixed below for stock layers
    h, d, H = cfg.hidden_size, cfg.head_dim, cfg.num_attention_heads
    for i in range(cfg.num_hidden_layers):
        p = layer_prefix(i) + "self_attn."
        n_kv = cfg.kv_heads_of_layer(i)
        for t in ("k", "v"):
            shapes[p + f"{t}_proj.weight"] = (n_kv * d, h)
            if cfg.attention_bias:
                shapes[p + f"{t}_proj.bias"] = (n_kv * d,)
        if cfg.is_mea_layer(i):
            shapes[p + "mea_k_lc"] = (cfg.num_key_value_heads, cfg.mea_kv_heads)
            shapes[p + "mea_v_lc"] = (cfg.num_key_value_heads, cfg.mea_kv_heads)
            if cfg.mea_group_norm:
                shapes[p + "mea_norm.weight"] = (H * d,)
    return shapes
