"""The Qwen3 shared-KV tensor contract: stock Qwen3 with shared_kv_proj in place of k_proj and v_proj."""
from __future__ import annotations

from ..checkpoint.contract import Shapes
from ..qwen3.contract import layer_prefix
from ..qwen3.contract import tensor_shapes as qwen3_tensor_shapes

__all__ = ["tensor_shapes", "share_kv"]


def share_kv(shapes: Shapes, cfg) -> Shapes:
    """`shapes` with each layer's k_proj / v_proj replaced by one shared_kv_proj [H_kv*d, h] (+ bias)."""
    h, d, h_kv = cfg.hidden_size, cfg.head_dim, cfg.num_key_value_heads
    for i in range(cfg.num_hidden_layers):
        p = layer_prefix(i) + "self_attn."
        for t in ("k", "v"):
            shapes.pop(p + f"{t}_proj.weight")
            shapes.pop(p + f"{t}_proj.bias", None)
        shapes[p + "shared_kv_proj.weight"] = (h_kv * d, h)
        if cfg.attention_bias:
            shapes[p + "shared_kv_proj.bias"] = (h_kv * d,)
    return shapes


def tensor_shapes(cfg) -> Shapes:
    return share_kv(qwen3_tensor_shapes(cfg), cfg)
