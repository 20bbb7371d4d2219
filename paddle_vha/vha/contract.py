"""The Qwen3-VHA tensor contract (docs/checkpoint.md): stock Qwen3 with a narrower q_proj and the vha_* tensors."""
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
    h, d, h_v, h_kv = cfg.hidden_size, cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads
    h_p, r, rank = h_v // h_kv, cfg.vha_q_head_dim, cfg.vha_postmix_rank
    for i in range(cfg.num_hidden_layers):
        p = layer_prefix(i) + "self_attn."
        shapes[p + "q_proj.weight"] = (h_p * r, h)
        if cfg.attention_bias:
            shapes[p + "q_proj.bias"] = (h_p * r,)
        if cfg.vha_shared_kv:  # one projection, K = V
            for t in ("k", "v"):
                shapes.pop(p + f"{t}_proj.weight")
                shapes.pop(p + f"{t}_proj.bias", None)
            shapes[p + "shared_kv_proj.weight"] = (h_kv * d, h)
            if cfg.attention_bias:
                shapes[p + "shared_kv_proj.bias"] = (h_kv * d,)
        shapes[p + "vha_premix_weight"] = (h_kv, r, d)
        shapes[p + "vha_postmix_U"] = (h_v, rank)
        shapes[p + "vha_postmix_V"] = (h_v, rank)
        if cfg.vha_gated_attention:
            shapes[p + "gate_proj.weight"] = (h_v * d, h)
    return shapes
