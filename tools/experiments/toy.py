"""The scaled-down Qwen3 the experiments train: one builder for the config fields of every toy model.

Byte-level vocabulary (the embedded corpus), untied embeddings, RoPE base 10000; the callers choose the width, depth,
heads and (the quick-start) the MLP width. Family-specific fields (vha_postmix_rank, mea_kv_heads, ...) are added by
the caller next to these.
"""
from __future__ import annotations

from typing import Optional

from paddle_vha.train.corpus import BYTE_VOCAB_SIZE

__all__ = ["toy_fields", "check_toy_args"]


def toy_fields(hidden: int, layers: int, head_dim: int, heads: int, kv_heads: int, seq_len: int,
               intermediate: Optional[int] = None, min_positions: int = 256) -> dict:
    """Qwen3 config fields: `heads` query heads of `head_dim` over `kv_heads` KV heads, an MLP of `intermediate`
    (default 3 x hidden), positions for max(min_positions, seq_len)."""
    return dict(vocab_size=BYTE_VOCAB_SIZE, hidden_size=hidden, num_hidden_layers=layers, head_dim=head_dim,
                intermediate_size=hidden * 3 if intermediate is None else intermediate, num_attention_heads=heads,
                num_key_value_heads=kv_heads, max_position_embeddings=max(min_positions, seq_len), rope_theta=10000.0,
                rms_norm_eps=1e-6, tie_word_embeddings=False)


def check_toy_args(p, args) -> None:
    """The options every study shares, refused through `p.error` (one line, exit 2) before anything is built: a
    finite positive learning rate, a width and depth that make a model, an even head width (RoPE), a corpus size and
    sequence length that make batches, seeds Paddle accepts."""
    import math

    for name in ("lr", "uptrain_lr"):
        v = getattr(args, name, None)
        if v is not None and not (math.isfinite(v) and v > 0):
            p.error(f"--{name.replace('_', '-')} {v}: must be a finite number > 0")
    if args.hidden < 8 or args.layers < 1:
        p.error(f"--hidden {args.hidden} / --layers {args.layers}: need a width >= 8 and at least one layer")
    if args.head_dim < 2 or args.head_dim % 2:
        p.error(f"--head-dim {args.head_dim}: must be even and >= 2 (RoPE rotates pairs)")
    if not (math.isfinite(args.corpus_mb) and args.corpus_mb > 0):
        p.error(f"--corpus-mb {args.corpus_mb}: must be a finite number > 0")
    if args.seq_len < 2:
        p.error(f"--seq-len {args.seq_len}: must be >= 2 (an input and its next token)")
    if any(not 0 <= s < 2**32 for s in args.seeds):
        p.error("--seeds: each must be in [0, 2**32)")
