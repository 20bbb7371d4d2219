"""Qwen3SharedKVAttention: Qwen3 attention whose keys and values are one tensor.

    Q = RoPE(q_norm(x W_Q))                      (B, H, S, d)      as Qwen3
    S = RoPE(k_norm(x W_S))                      (B, H_kv, S, d)   shared_kv_proj: the keys and the values; cached once
    Y = R(-theta s) Attention(Q, S, S)           (B, S, H, d)      output rotated back by the query's own angle
    out = Y W_O

Every deviation from PaddleFormers' Qwen3Attention is marked `# SKV:`.
"""
from __future__ import annotations

from typing import Optional, Tuple

import paddle
from paddleformers.transformers.qwen3.modeling import Qwen3Attention, apply_rotary_pos_emb

from ..qwen3.functional import inverse_rope
from ..modeling.parameters import build_declared
from ..qwen3.modeling import attention_core, update_shared_kv_cache
from .config import Qwen3SharedKVConfig
from .spec import SHARED_KV_LAYER

__all__ = ["Qwen3SharedKVAttention"]


class Qwen3SharedKVAttention(Qwen3Attention):
    """Stock Qwen3 attention with one shared K = V projection and the output rotated back (inverse RoPE)."""

    def __init__(self, config: Qwen3SharedKVConfig, layer_idx: int = 0):
        config.check_runtime_support()
        super().__init__(config, layer_idx)
        build_declared(self, SHARED_KV_LAYER, config, layer_idx, "self_attn.")  # SKV: shared_kv_proj for k_proj, v_proj

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
        d = self.head_dim
        q = self.q_norm(self.q_proj(hidden_states).reshape([0, 0, self.num_heads, d]))  # (B, S, H, d)
        s = self.k_norm(self.shared_kv_proj(hidden_states).reshape([0, 0, self.num_key_value_heads, d]))  # SKV
        cos, sin = position_embeddings
        q, s = apply_rotary_pos_emb(q.transpose([0, 2, 1, 3]), s.transpose([0, 2, 1, 3]), cos, sin)  # (B, H*, S, d)
        if past_key_values is not None:  # SKV: the cache holds S once
            s = update_shared_kv_cache(past_key_values, s, self.layer_idx)  # (B, H_kv, T, d)
        y, attn_weights = attention_core(self, q, s, s, attention_mask, attn_mask_startend_row_indices,
                                         getattr(self, "sinks", None))  # (B, S, H*d); sinks on window layers
        y = y.reshape([0, 0, self.num_heads, d])  # (B, S, H, d)
        y = inverse_rope(y, cos.unsqueeze(2).astype(y.dtype), sin.unsqueeze(2).astype(y.dtype))  # SKV: R(-theta s)
        return self.o_proj(y.flatten(2)), attn_weights
