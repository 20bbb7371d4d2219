"""The scaled-down Qwen3 the experiments train: one builder for the config fields of every toy model.

Byte-level vocabulary (the embedded corpus), untied embeddings, RoPE base 10000; the callers choose the width, depth,
heads and (the quick-start) the MLP width. Family-specific fields (vha_postmix_rank, mea_kv_heads, ...) are added by
the caller next to these.
"""
from __future__ import annotations

from typing import Optional

from paddle_vha.train.corpus import BYTE_VOCAB_SIZE

__all__ = ["toy_fields"]


def toy_fields(hidden: int, layers: int, head_dim: int, heads: int, kv_heads: int, seq_len: int,
               intermediate: Optional[int] = None, min_positions: int = 256) -> dict:
    """Qwen3 config fields: `heads` query heads of `head_dim` over `kv_heads` KV heads, an MLP of `intermediate`
    (default 3 x hidden), positions for max(min_positions, seq_len)."""
    return dict(vocab_size=BYTE_VOCAB_SIZE, hidden_size=hidden, num_hidden_layers=layers, head_dim=head_dim,
                intermediate_size=hidden * 3 if intermediate is None else intermediate, num_attention_heads=heads,
                num_key_value_heads=kv_heads, max_position_embeddings=max(min_positions, seq_len), rope_theta=10000.0,
                rms_norm_eps=1e-6, tie_word_embeddings=False)
