"""The stock Qwen3 tensor contract: names and Hugging Face-layout shapes ([out, in] for Linear weights).

Both families start from it: Qwen3-VHA narrows q_proj and adds its vha_* tensors, Qwen3-MEA changes k_proj / v_proj
of its layers and adds the HLC coefficients; a folded VHA checkpoint is exactly this.
"""
from __future__ import annotations

from ..checkpoint.contract import Shapes

__all__ = ["tensor_shapes", "layer_prefix"]


def layer_prefix(i: int) -> str:
    return f"model.layers.{i}."


def tensor_shapes(cfg) -> Shapes:
    """Stock Qwen3 tensor names -> HF-layout shapes, for any config object with Qwen3's fields."""
    h, d, L = cfg.hidden_size, cfg.head_dim, cfg.num_hidden_layers
    h_q, h_kv, inter, vocab = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.intermediate_size, cfg.vocab_size
    shapes: Shapes = {"model.embed_tokens.weight": (vocab, h), "model.norm.weight": (h,)}
    if not cfg.tie_word_embeddings:
        shapes["lm_head.weight"] = (vocab, h)
    for i in range(L):
        p = layer_prefix(i)
        shapes.update(
            {
                p + "input_layernorm.weight": (h,),
                p + "post_attention_layernorm.weight": (h,),
                p + "mlp.gate_proj.weight": (inter, h),
                p + "mlp.up_proj.weight": (inter, h),
                p + "mlp.down_proj.weight": (h, inter),
                p + "self_attn.q_proj.weight": (h_q * d, h),
                p + "self_attn.k_proj.weight": (h_kv * d, h),
                p + "self_attn.v_proj.weight": (h_kv * d, h),
                p + "self_attn.o_proj.weight": (h, h_q * d),
                p + "self_attn.q_norm.weight": (d,),
                p + "self_attn.k_norm.weight": (d,),
            }
        )
        if cfg.attention_bias:
            shapes.update(
                {
                    p + "self_attn.q_proj.bias": (h_q * d,),
                    p + "self_attn.k_proj.bias": (h_kv * d,),
                    p + "self_attn.v_proj.bias": (h_kv * d,),
                    p + "self_attn.o_proj.bias": (h,),
                }
            )
    return shapes
