"""The Qwen3-VHA tensor contract (docs/checkpoint.md): stock Qwen3 with a narrower q_proj and the vha_* tensors, per
layer (a sliding-window layer may have its own head counts, widths and ranks)."""
from __future__ import annotations

from ..checkpoint.contract import Shapes
from ..qwen3.contract import layer_prefix
from ..qwen3.contract import tensor_shapes as qwen3_tensor_shapes

__all__ = ["tensor_shapes", "VHA_ONLY"]

# Tensors only a Qwen3-VHA attention has; fold absorbs them into q_proj / o_proj.
VHA_ONLY = ("vha_premix_weight", "vha_postmix_U", "vha_postmix_V")


def tensor_shapes(cfg) -> Shapes:
    """Qwen3-VHA tensor names -> HF-layout shapes."""
    shapes = qwen3_tensor_shapes(cfg)
    h = cfg.hidden_size
    for i in range(cfg.num_hidden_layers):
        dims = cfg.layer_dims(i)
        h_v, h_kv, d, r, rank = dims.num_heads, dims.num_kv_heads, dims.head_dim, dims.q_head_dim, dims.postmix_rank
        p = layer_prefix(i) + "self_attn."
        shapes[p + "q_proj.weight"] = (dims.num_physical_heads * r, h)
        shapes[p + "o_proj.weight"] = (h, h_v * d)
        shapes[p + "q_norm.weight"] = shapes[p + "k_norm.weight"] = (d,)
        kv = ("shared_kv",) if cfg.vha_shared_kv else ("k", "v")
        for t in ("k", "v"):
            shapes.pop(p + f"{t}_proj.weight")
            shapes.pop(p + f"{t}_proj.bias", None)
        for t in kv:  # one shared projection (K = V), or K and V
            shapes[p + f"{t}_proj.weight"] = (h_kv * d, h)
        if cfg.attention_bias:
            shapes[p + "q_proj.bias"] = (dims.num_physical_heads * r,)
            for t in kv:
                shapes[p + f"{t}_proj.bias"] = (h_kv * d,)
        shapes[p + "vha_premix_weight"] = (h_kv, r, d)
        shapes[p + "vha_postmix_U"] = (h_v, rank)
        shapes[p + "vha_postmix_V"] = (h_v, rank)
        if cfg.vha_gated_attention:
            shapes[p + "gate_proj.weight"] = (h_v * d, h)
    return shapes
