"""fused_prologue: the layers' call into the fused VHA prologue operator (forward; backward through its grad op).

One operator does what the layer's composed path does in five passes over memory:

    q = premix(q_phys, W)  ->  q_norm  ->  RoPE        (B, S, H_p, r) -> (B, H_v, S, d)   [heads_first]
    k = k                  ->  k_norm  ->  RoPE        (B, S, H_kv, d) -> (B, H_kv, S, d)

with Qwen3's rotate-half RoPE from the (B, S, d) cos/sin tables of Qwen3RotaryEmbedding; backward gives
gradients for q_phys, k, the Premix weight and both norm weights. Whether a layer calls it is dispatch.py's
decision. See docs/prologue.md.
"""
from __future__ import annotations

import paddle

from .op_loader import FusedPrologueUnavailable, load_error, load_op

__all__ = ["fused_prologue"]


@paddle.jit.not_to_static  # plain Python under to_static: it only picks and calls the op
def fused_prologue(q_phys, k, premix_weight, q_norm_weight, k_norm_weight, cos, sin, eps: float,
                   heads_first: bool = True):
    """Premix -> q_norm / k_norm -> RoPE in one op.

    q_phys (B, S, H_p, r), k (B, S, H_kv, d), premix_weight (H_kv, r, d), norm weights (d,), cos/sin (B or 1, S, d).
    Returns q (B, H_v, S, d) and k (B, H_kv, S, d) with heads_first (the attention layout), else (B, S, H, d).
    Every input is cast to q_phys's dtype (as the composed path's tables already are).
    """
    mod = load_op()
    if mod is None:
        raise FusedPrologueUnavailable(f"fused prologue unavailable: {load_error()}")
    dt = q_phys.dtype
    args = [t if t.dtype == dt else t.astype(dt) for t in (k, premix_weight, q_norm_weight, k_norm_weight, cos, sin)]
    q_out, k_out = mod.vha_prologue(q_phys, *args, float(eps), bool(heads_first))
    return q_out, k_out
