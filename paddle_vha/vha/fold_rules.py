"""Qwen3-VHA's fold roles (paddle_vha/spec/fold.py): Premix absorbed into q_proj, Postmix into o_proj. Exact, float64.

The math (docs/method.md, "Why it folds"), in on-disk layout (Linear weights [out, in]):

    q_proj:  W_Q [H_p*r, h] and Premix P [H_kv, r, d]  ->  W_Q' [H_v*d, h]
             block j = g*H_p + i of W_Q' is P[g]^T W_Q^(i)       (Q_v[j] = x W_Q^(i)T P[g]);  b_q'[j] = b_q^(i) P[g]
    o_proj:  W_O [h, H_v*d], M = I + V U^T [H_v, H_v]       ->  W_O' [h, H_v*d]
             input block k of W_O' is sum_j M[j, k] W_O[:, j]   (W_O' = W_O (M (x) I_d))

The spec (paddle_vha/vha/spec.py) names PREMIX on the Premix tensor and POSTMIX on U and V; without Premix
(vha_premix=false) the layer has no Premix tensor, so q_proj is copied and only o_proj changes.
"""
from __future__ import annotations

import numpy as np

from ..spec.fold import FoldRule

__all__ = ["fold_q_proj", "fold_q_bias", "fold_o_proj", "PREMIX", "POSTMIX"]


def fold_q_proj(w_q: np.ndarray, premix: np.ndarray) -> np.ndarray:
    """[H_p*r, h] q_proj and [H_kv, r, d] Premix -> [H_v*d, h] stock q_proj (float64), virtual heads group-major."""
    h_kv, r, d = premix.shape
    w = np.asarray(w_q, np.float64).reshape(-1, r, w_q.shape[-1])  # (H_p, r, h)
    p_t = np.asarray(premix, np.float64).transpose(0, 2, 1)  # (H_kv, d, r)
    out = np.matmul(p_t[:, None], w[None])  # (H_kv, 1, d, r) @ (1, H_p, r, h) -> (H_kv, H_p, d, h): block g*H_p + i
    return out.reshape(h_kv * w.shape[0] * d, w.shape[-1])  # (H_v*d, h)


def fold_q_bias(b_q: np.ndarray, premix: np.ndarray) -> np.ndarray:
    """[H_p*r] q bias -> [H_v*d]: virtual head g*H_p + i gets b^(i) P[g]."""
    h_kv, r, d = premix.shape
    b = np.asarray(b_q, np.float64).reshape(-1, r)  # (H_p, r)
    return np.einsum("ir,grd->gid", b, np.asarray(premix, np.float64)).reshape(-1)  # (H_kv*H_p*d,)


def fold_o_proj(w_o: np.ndarray, u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """[h, H_v*d] o_proj and Postmix U, V [H_v, R] -> [h, H_v*d]: input block k is sum_j M[j, k] W_O[:, j]."""
    h_v = u.shape[0]
    m = np.eye(h_v) + np.asarray(v, np.float64) @ np.asarray(u, np.float64).T  # (H_v, H_v), M = I + V U^T
    w = np.asarray(w_o, np.float64).reshape(w_o.shape[0], h_v, -1)  # (h, H_v, d)
    out = np.matmul(m.T, w)  # (H_v, H_v) @ (h, H_v, d) -> (h, H_v, d): block k = sum_j M[j, k] W[:, j]
    return out.reshape(w_o.shape)  # (h, H_v*d)


PREMIX = FoldRule("self_attn.q_proj", "fold Premix", {"weight": fold_q_proj, "bias": fold_q_bias})
POSTMIX = FoldRule("self_attn.o_proj", "fold Postmix", {"weight": fold_o_proj})  # sources: W_O, U, V (spec order)
