"""Stock Qwen3's tensors, declared once (paddle_vha/spec/params.py): the base every variant derives its spec from.

On-disk shapes are Hugging Face's ([out, in] for Linear weights). Tensor parallelism as Megatron splits a GQA layer:
query heads column-parallel, o_proj row-parallel, K/V split by KV head when t <= H_kv and whole otherwise (each rank
computing its KV head, gradient summed), q_norm / k_norm whole with summed gradients (each rank normalizes its own
heads), the MLP column / row-parallel; the layer norms, the embedding and the LM head whole.
"""
from __future__ import annotations

from types import SimpleNamespace

from ..spec.params import COLUMN, ROW, SUMMED, LayerSpec, ModelSpec, Param, linear, split_kv

__all__ = ["tensor_shapes", "QWEN3_LAYER", "QWEN3", "TOP", "stock_sizes", "top_sizes", "O_PROJ"]


def stock_sizes(cfg, layer_idx: int, kv_heads: int = None) -> SimpleNamespace:
    """A stock layer's sizes: h, MLP width, H query heads and H_kv KV heads of width d, the bias flags (`bias`: q / k /
    v_proj's and any other projection of the queries, keys or values; `o_bias`: o_proj's; Qwen3's attention_bias sets
    both). The widths are read only if the config has them (a plan's shards need the head counts and flags alone: the
    TP plans take any object with the fields they read; a shape computed from a missing width is None and fails any
    shape check)."""
    bias = bool(getattr(cfg, "attention_bias", False))
    return SimpleNamespace(h=getattr(cfg, "hidden_size", None), inter=getattr(cfg, "intermediate_size", None),
                           heads=cfg.num_attention_heads, head_dim=getattr(cfg, "head_dim", None),
                           kv_heads=cfg.num_key_value_heads if kv_heads is None else kv_heads, bias=bias, o_bias=bias)


def top_sizes(cfg) -> SimpleNamespace:
    return SimpleNamespace(vocab=cfg.vocab_size, h=cfg.hidden_size, tied=bool(cfg.tie_word_embeddings))


TOP = (
    Param("model.embed_tokens.weight", lambda s: (s.vocab, s.h)),
    Param("model.norm.weight", lambda s: (s.h,)),
    Param("lm_head.weight", lambda s: (s.vocab, s.h), when=lambda s: not s.tied),  # tied: the embedding is the head
)

_q_w, _q_b = linear("self_attn.q_proj", lambda s: s.heads * s.head_dim, lambda s: s.h, COLUMN)
_k_w, _k_b = linear("self_attn.k_proj", lambda s: s.kv_heads * s.head_dim, lambda s: s.h, split_kv(COLUMN))
_v_w, _v_b = linear("self_attn.v_proj", lambda s: s.kv_heads * s.head_dim, lambda s: s.h, split_kv(COLUMN))
_o_w, _o_b = linear("self_attn.o_proj", lambda s: s.h, lambda s: s.heads * s.head_dim, ROW, bias=lambda s: s.o_bias)

O_PROJ = (_o_w, _o_b)  # o_proj as every base declares it: H heads of width d in, its bias where o_bias holds

QWEN3_LAYER = LayerSpec(
    "qwen3",
    sizes=stock_sizes,
    params=(
        Param("input_layernorm.weight", lambda s: (s.h,)),
        Param("post_attention_layernorm.weight", lambda s: (s.h,)),
        *linear("mlp.gate_proj", lambda s: s.inter, lambda s: s.h, COLUMN, bias=None),
        *linear("mlp.up_proj", lambda s: s.inter, lambda s: s.h, COLUMN, bias=None),
        *linear("mlp.down_proj", lambda s: s.h, lambda s: s.inter, ROW, bias=None),
        _q_w, _k_w, _v_w, _o_w,
        Param("self_attn.q_norm.weight", lambda s: (s.head_dim,), SUMMED),
        Param("self_attn.k_norm.weight", lambda s: (s.head_dim,), SUMMED),
        _q_b, _k_b, _v_b, _o_b,
    ),
    # PaddleFormers' Qwen3 flex-checkpoint rules transpose these Linears already
    base_linears=("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
                  "mlp.up_proj", "mlp.down_proj"),
)

QWEN3 = ModelSpec(top=TOP, top_sizes=top_sizes, layer=lambda cfg, i: QWEN3_LAYER)

tensor_shapes = QWEN3.tensor_shapes  # the on-disk contract: name -> HF-layout shape
