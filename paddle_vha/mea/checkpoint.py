"""The Qwen3-MEA checkpoint contract: tensor names and shapes, validated from safetensors headers only."""
from __future__ import annotations

from ..checkpoint import Shapes, compare_shapes, load_typed_config, qwen3_tensor_shapes, read_tensor_shapes

__all__ = ["mea_tensor_shapes", "load_mea_config", "validate_mea_checkpoint"]


def mea_tensor_shapes(cfg) -> Shapes:
    """Qwen3-MEA tensor names -> HF-layout shapes.

    Stock Qwen3 names everywhere; MEA layers have n_p-head k_proj / v_proj and mea_k_lc, mea_v_lc [n_p, n_v]
    (+ mea_norm.weight [H*d] with mea_group_norm); stock layers have mea_stock_kv_heads-head k_proj / v_proj.
    """
    shapes = qwen3_tensor_shapes(cfg)  # k/v sized by num_key_value_heads = n_p; fixed below for stock layers
    h, d, H = cfg.hidden_size, cfg.head_dim, cfg.num_attention_heads
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}.self_attn."
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


def load_mea_config(ckpt_dir: str):
    """Qwen3MEAConfig of a checkpoint folder, with config errors turned into one-line CheckpointErrors."""
    from .config import Qwen3MEAConfig

    return load_typed_config(ckpt_dir, Qwen3MEAConfig, "Qwen3-MEA")


def validate_mea_checkpoint(ckpt_dir: str):
    """Check a Qwen3-MEA checkpoint folder against the contract; returns its config."""
    cfg = load_mea_config(ckpt_dir)
    compare_shapes(ckpt_dir, read_tensor_shapes(ckpt_dir), mea_tensor_shapes(cfg))
    return cfg
