"""The multi-query serving form of MEA attention ('before_hlc' models): one wide KV head, HLC moved to the queries.

With k_norm before HLC the cache holds normed, rotated physical heads K_p, V_p (B, n_p, T, d). Query head i reads
virtual head j = i // (H / n_v), and

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

from .config import MEAConfigError

__all__ = ["multiquery_attention", "widen_queries", "use_multiquery_form"]


def widen_queries(q: paddle.Tensor, k_lc: paddle.Tensor, groups: int) -> paddle.Tensor:
    """(B, H, S, d) queries -> (B, H, S, n_p*d): head i becomes [k_lc[p, i // groups] * q_i for p in range(n_p)]."""
    n_p = k_lc.shape[0]
    coef = paddle.repeat_interleave(k_lc, groups, axis=1).transpose([1, 0])  # (H, n_p): coef[i, p] = k_lc[p, i // G]
    wide = q.unsqueeze(3) * coef.reshape([1, coef.shape[0], 1, n_p, 1]).astype(q.dtype)  # (B, H, S, n_p, d)
    return wide.flatten(3)


def multiquery_attention(attn, q, k_p, v_p, attention_mask=None) -> paddle.Tensor:
    """MEA attention of one layer in the multi-query form. q (B, H, S, d) rotated; k_p, v_p (B, n_p, T, d) from the
    cache ('before_hlc': normed and rotated). Returns (B, S, H*d), as the attention backends do."""
    B, H, S, d = q.shape
    n_p, T = k_p.shape[1], k_p.shape[2]
    groups = attn.num_key_value_groups  # H / n_v
    k_lc, v_lc = attn.hlc_coefficients()  # [n_p, n_v] (under tensor parallelism: this rank's virtual heads)
    q_wide = widen_queries(q, k_lc, groups).reshape([B, H * S, n_p * d])  # all heads share the KV head
    k_wide = k_p.transpose([0, 2, 1, 3]).reshape([B, T, n_p * d])  # one KV head of width n_p*d
    v_wide = v_p.transpose([0, 2, 1, 3]).reshape([B, T, n_p * d])
    scores = paddle.matmul(q_wide, k_wide, transpose_y=True) * (1.0 / math.sqrt(d))  # (B, H*S, T)
    scores = scores.reshape([B, H, S, T])
    if attention_mask is not None:
        scores = scores + attention_mask[:, :, :, :T].astype(scores.dtype)
    elif S > 1:  # causal, the new S tokens at the end of the T keys
        rows = paddle.arange(S, dtype="int64").unsqueeze(1) + (T - S)
        allowed = paddle.arange(T, dtype="int64").unsqueeze(0) <= rows
        scores = paddle.where(allowed, scores, paddle.full_like(scores, float("-inf")))
    probs = paddle.nn.functional.softmax(scores.astype("float32"), axis=-1).astype(q.dtype).reshape([B, H * S, T])
    out = paddle.matmul(probs, v_wide).reshape([B, H, S, n_p, d])  # sum_t a_i(t) V_p(t), every p
    coef_v = paddle.repeat_interleave(v_lc, groups, axis=1).transpose([1, 0])  # (H, n_p)
    c = (out * coef_v.reshape([1, H, 1, n_p, 1]).astype(out.dtype)).sum(axis=3)  # (B, H, S, d): V-side HLC
    return c.transpose([0, 2, 1, 3]).reshape([B, S, H * d])


def use_multiquery_form(model, enabled: bool = True):
    """Switch every MEA layer of `model` (a Qwen3MEA model or layer) to the multi-query serving form (or back)."""
    from .attention import Qwen3MEAAttention

    layers = [m for m in model.sublayers(include_self=True) if isinstance(m, Qwen3MEAAttention)]
    if enabled:
        bad = [m.layer_idx for m in layers if m.k_norm_after_hlc]
        if bad:
            raise MEAConfigError(
                f"the multi-query serving form needs mea_k_norm_position='before_hlc' (k_norm on the cached physical "
                f"heads); MEA layers {bad} normalise after HLC")
    for m in layers:
        m.serving_form = enabled
    return model
