"""Stock Qwen3's math as functions of plain tensors, for graphs built outside PaddleFormers' modules (the exported
decoder, paddle_vha/export/decoder.py). Each matches the PaddleFormers module it names; the export's self-validation
and tests/test_export_serve.py check that against PaddleFormers' Qwen3ForCausalLM."""
from __future__ import annotations

import paddle

__all__ = ["rms_norm", "rotate_half", "apply_rope", "inverse_rope", "rope_tables", "grouped_attention",
           "grouped_attention_past_new", "swiglu_mlp"]


def rms_norm(x, weight, eps: float):
    """Qwen3's RMSNorm over the last axis (float32 graphs)."""
    var = paddle.mean(x * x, axis=-1, keepdim=True)
    return x * paddle.rsqrt(var + eps) * weight


def rotate_half(x, half: int):
    """[x1, x2] -> [-x2, x1] over the last axis, split at `half` (given: the width may be symbolic in a graph)."""
    return paddle.concat([-x[..., half:], x[..., :half]], axis=-1)


def apply_rope(x, cos, sin):
    """Rotate-half RoPE; x (..., d) with cos / sin broadcast to it."""
    return x * cos + rotate_half(x, x.shape[-1] // 2) * sin


def inverse_rope(x, cos, sin):
    """RoPE's inverse, R(-theta t) x: what rotating by the negated angle gives (shared-KV attention rotates its output
    back to the query's position with it)."""
    return apply_rope(x, cos, -sin)


def rope_tables(position_ids, inv_freq, dtype):
    """cos, sin (B, S, 1, d) at absolute positions (B, S) for inverse frequencies (1, 1, d/2), as Qwen3RotaryEmbedding."""
    freqs = position_ids.astype("float32").unsqueeze(-1) * inv_freq  # (B, S, d/2)
    emb = paddle.concat([freqs, freqs], axis=-1).unsqueeze(2)
    return paddle.cos(emb).astype(dtype), paddle.sin(emb).astype(dtype)


def grouped_attention(q, k, v, mask, scale: float, sinks=None):
    """Softmax attention in the grouped layout. q (B, H, S, w); k, v (B, H_kv, T, w); query head j = kv*G + i reads KV
    head kv. Its G*S query rows share one read of K and V (no repeat-KV copy): mask is additive, (B, 1, G*S, T) with
    row i*S + s. sinks (H,) or None: head j's softmax denominator gains exp(sinks[j]) (one more softmax column, no
    value: docs/method.md, "Attention sinks"). Returns (B, H, S, w)."""
    h_kv, width = k.shape[1], q.shape[-1]
    qg = q.reshape([0, h_kv, -1, width])  # (B, H_kv, G*S, w): heads of one group are consecutive
    scores = paddle.matmul(qg, k, transpose_y=True) * scale  # (B, H_kv, G*S, T)
    logits = scores.astype("float32") + mask
    if sinks is None:
        probs = paddle.nn.functional.softmax(logits, axis=-1)
    else:
        g = sinks.shape[0] // h_kv
        col = paddle.zeros_like(logits[:, :, :, :1]).reshape([0, h_kv, g, -1])  # (B, H_kv, G, S)
        col = (col + sinks.astype("float32").reshape([1, h_kv, g, 1])).reshape([0, h_kv, -1, 1])  # (B, H_kv, G*S, 1)
        probs = paddle.nn.functional.softmax(paddle.concat([logits, col], axis=-1), axis=-1)[:, :, :, :-1]
    y = paddle.matmul(probs.astype(v.dtype), v)  # (B, H_kv, G*S, w)
    return y.reshape([0, q.shape[1], -1, width])  # (B, H, S, w)


def grouped_attention_past_new(q, k_past, v_past, k_new, v_new, mask, scale: float, t=None):
    """grouped_attention over the keys of a cache buffer and the new tokens' keys without joining them: their scores
    are joined (G*S rows, not the cache), so the cache is read once and copied nowhere. k_past, v_past
    (B, H_kv, T, w) with T the buffer's capacity (t: T as a tensor, when the caller has it); k_new, v_new
    (B, H_kv, S, w); mask (B, 1, G*S, T + S), additive. Returns (B, H, S, w)."""
    h_kv, width = k_past.shape[1], q.shape[-1]
    qg = q.reshape([0, h_kv, -1, width]) * scale  # (B, H_kv, G*S, w), scaled here: fewer elements than the scores
    scores = paddle.concat([paddle.matmul(qg, k_past, transpose_y=True),
                            paddle.matmul(qg, k_new, transpose_y=True)], axis=-1)  # (B, H_kv, G*S, T + S)
    probs = paddle.nn.functional.softmax(scores.astype("float32") + mask, axis=-1).astype(v_past.dtype)
    t = paddle.shape(k_past)[2] if t is None else t
    y = paddle.matmul(probs[:, :, :, :t], v_past) + paddle.matmul(probs[:, :, :, t:], v_new)  # (B, H_kv, G*S, w)
    return y.reshape([0, q.shape[1], -1, width])  # (B, H, S, w)


def swiglu_mlp(x, w_gate, w_up, w_down):
    """Qwen3's MLP with [in, out] weights: down(silu(gate(x)) * up(x))."""
    return paddle.matmul(paddle.nn.functional.silu(paddle.matmul(x, w_gate)) * paddle.matmul(x, w_up), w_down)
