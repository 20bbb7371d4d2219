"""MEA's math as functions of tensors (docs/mea.md): HLC, the head norm, and the multi-query serving form.

Used by the layers (paddle_vha/mea/attention.py) and by the exported decoder (paddle_vha/mea/serving.py), so the
served graph computes exactly what the trained layer does.

The multi-query serving form ('before_hlc' models). With k_norm before HLC the cache holds normed, rotated physical
heads K_p, V_p (B, n_p, T, d). Query head i reads virtual head j = i // (H / n_v), and

    score_i(t) = q_i . K_v[j](t) = sum_p k_lc[p, j] q_i . K_p(t) = [k_lc[0, j] q_i | ... | k_lc[n_p-1, j] q_i] . [K_0(t) | ... | K_{n_p-1}(t)]
    C_i        = sum_t a_i(t) V_v[j](t) = sum_p v_lc[p, j] (sum_t a_i(t) V_p(t))

so attention runs as multi-query attention over ONE KV head of width n_p*d (the physical heads concatenated):
K-side HLC coefficients absorbed into each query (a per-head scale of n_p copies), softmax scale still 1/sqrt(d),
then the V-side coefficients applied to the n_p*d-wide output. Nothing virtual is ever materialised per cached
token, and every query head reads the same cache bytes once — the layout a stock MQA kernel wants
(queries laid out [B, 1, H*S, n_p*d] against keys [B, 1, T, n_p*d]).

`tests/test_mea_serving.py` proves it equal to the direct form (and to the float64 oracle).
"""
from __future__ import annotations

import math

import paddle

__all__ = ["hlc", "head_rms_norm", "query_coefficients", "widen_queries", "apply_value_coefficients",
           "wide_kv_head", "multiquery_attention"]


def hlc(t: paddle.Tensor, lc: paddle.Tensor) -> paddle.Tensor:
    """Head-level linear composition along axis 1: (B, n_p, T, d) x (n_p, n_v) -> (B, n_v, T, d).

    einsum("b p t d, p v -> b v t d"), written as one matmul over the head axis (3x faster than paddle.einsum on CPU).
    """
    return paddle.matmul(t.transpose([0, 2, 3, 1]), lc.astype(t.dtype)).transpose([0, 3, 1, 2])


def head_rms_norm(y: paddle.Tensor, weight: paddle.Tensor, eps: float) -> paddle.Tensor:
    """RMSNorm of each head's d channels, then the per-channel weight. y (B, S, H, d), weight [H*d] (or [H, d]).

    Computed in float32 for 16-bit inputs (as Qwen3's RMSNorm), in the input dtype for float32 / float64."""
    yc = y if y.dtype in (paddle.float32, paddle.float64) else y.astype("float32")
    yc = yc * paddle.rsqrt(yc.pow(2).mean(-1, keepdim=True) + eps)
    return yc.astype(y.dtype) * weight.reshape(y.shape[2:])


def query_coefficients(lc: paddle.Tensor, groups: int) -> paddle.Tensor:
    """HLC coefficients per query head: (n_p, n_v) -> (H, n_p) with coef[i, p] = lc[p, i // groups]."""
    return paddle.repeat_interleave(lc, groups, axis=1).transpose([1, 0])


def widen_queries(q: paddle.Tensor, coef_k: paddle.Tensor) -> paddle.Tensor:
    """(B, H, S, d) queries -> (B, H, S, n_p*d): head i becomes [coef_k[i, p] * q_i for p in range(n_p)]."""
    h, n_p = coef_k.shape
    wide = q.unsqueeze(3) * coef_k.reshape([1, h, 1, n_p, 1]).astype(q.dtype)  # (B, H, S, n_p, d)
    return wide.flatten(3)


def apply_value_coefficients(out: paddle.Tensor, coef_v: paddle.Tensor) -> paddle.Tensor:
    """(B, S, H, n_p*d) attention output over the wide head -> (B, S, H, d): sum_p coef_v[i, p] * out_i[p] (V-side HLC)."""
    h, n_p = coef_v.shape
    wide = out.reshape([0, 0, h, n_p, out.shape[-1] // n_p])  # (B, S, H, n_p, d)
    return (wide * coef_v.reshape([1, 1, h, n_p, 1]).astype(out.dtype)).sum(axis=3)


def wide_kv_head(t: paddle.Tensor) -> paddle.Tensor:
    """(B, n_p, T, d) physical heads -> (B, 1, T, n_p*d): one KV head, the physical heads side by side."""
    return t.transpose([0, 2, 1, 3]).flatten(2).unsqueeze(1)


def multiquery_attention(q, k_p, v_p, k_lc, v_lc, groups: int, attention_mask=None) -> paddle.Tensor:
    """MEA attention of one layer in the multi-query form. q (B, H, S, d) rotated; k_p, v_p (B, n_p, T, d) from the
    cache ('before_hlc': normed and rotated); k_lc, v_lc [n_p, n_v]; groups = H / n_v. Returns (B, S, H*d), as the
    attention backends do."""
    B, H, S, d = q.shape
    n_p, T = k_p.shape[1], k_p.shape[2]
    q_wide = widen_queries(q, query_coefficients(k_lc, groups)).reshape([B, H * S, n_p * d])  # all heads, one KV head
    k_wide = wide_kv_head(k_p).squeeze(1)  # (B, T, n_p*d)
    v_wide = wide_kv_head(v_p).squeeze(1)
    scores = paddle.matmul(q_wide, k_wide, transpose_y=True) * (1.0 / math.sqrt(d))  # (B, H*S, T)
    scores = scores.reshape([B, H, S, T])
    if attention_mask is not None:
        scores = scores + attention_mask[:, :, :, :T].astype(scores.dtype)
    elif S > 1:  # causal, the new S tokens at the end of the T keys
        rows = paddle.arange(S, dtype="int64").unsqueeze(1) + (T - S)
        allowed = paddle.arange(T, dtype="int64").unsqueeze(0) <= rows
        scores = paddle.where(allowed, scores, paddle.full_like(scores, float("-inf")))
    probs = paddle.nn.functional.softmax(scores.astype("float32"), axis=-1).astype(q.dtype).reshape([B, H * S, T])
    out = paddle.matmul(probs, v_wide).reshape([B, H, S, n_p * d]).transpose([0, 2, 1, 3])  # (B, S, H, n_p*d)
    c = apply_value_coefficients(out, query_coefficients(v_lc, groups))  # (B, S, H, d)
    return c.reshape([B, S, H * d])
