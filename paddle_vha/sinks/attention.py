"""Qwen3SinksAttention: Qwen3 attention whose sliding-window layers add a learned sink to the softmax.

    Q = RoPE(q_norm(x W_Q)), K = RoPE(k_norm(x W_K)), V = x W_V        as Qwen3
    Y_h = sum_t exp(a_ht) v_t / (sum_t exp(a_ht) + exp(s_h))           on a window layer (s: self_attn.sinks [H])
    out = Y W_O

Every deviation from PaddleFormers' Qwen3Attention is marked `# SINK:`.
"""
from __future__ import annotations

from typing import Optional, Tuple

import paddle
from paddleformers.transformers.qwen3.modeling import Qwen3Attention, apply_rotary_pos_emb

from ..modeling.parameters import build_declared
from ..qwen3.modeling import attention_core
from .config import Qwen3SinksConfig
from .spec import SINKS_LAYER

__all__ = ["Qwen3SinksAttention"]


class Qwen3SinksAttention(Qwen3Attention):
    """Stock Qwen3 attention plus a sink logit per head on window layers."""

    def __init__(self, config: Qwen3SinksConfig, layer_idx: int = 0):
        config.check_runtime_support()
        super().__init__(config, layer_idx)
        build_declared(self, SINKS_LAYER, config, layer_idx, "self_attn.")  # SINK: self_attn.sinks on window layers

    def forward(
        self,
        hidden_states,
        position_embeddings: Optional[Tuple[paddle.Tensor, paddle.Tensor]] = None,
        attention_mask: Optional[paddle.Tensor] = None,
        past_key_values=None,
        use_cache: bool = False,
        attn_mask_startend_row_indices: Optional[paddle.Tensor] = None,
        batch_size: Optional[int] = None,
        **kwargs,
    ):
        d, h_kv = self.head_dim, self.num_key_value_heads
        q = self.q_norm(self.q_proj(hidden_states).reshape([0, 0, self.num_heads, d]))  # (B, S, H, d)
        k = self.k_norm(self.k_proj(hidden_states).reshape([0, 0, h_kv, d]))  # (B, S, H_kv, d)
        v = self.v_proj(hidden_states).reshape([0, 0, h_kv, d]).transpose([0, 2, 1, 3])  # (B, H_kv, S, d)
        cos, sin = position_embeddings
        q, k = apply_rotary_pos_emb(q.transpose([0, 2, 1, 3]), k.transpose([0, 2, 1, 3]), cos, sin)  # (B, H*, S, d)
        if past_key_values is not None:
            k, v = past_key_values.update(k, v, self.layer_idx)  # (B, H_kv, T, d)
        y, attn_weights = attention_core(self, q, k, v, attention_mask, attn_mask_startend_row_indices,
                                         getattr(self, "sinks", None))  # SINK: (B, S, H*d)
        return self.o_proj(y), attn_weights
