"""Float64 numpy reference of the VHA attention prologue (forward and vector-Jacobian product), from the math.

Imports nothing from paddle_vha or paddle. Shapes: q_phys (B, S, H_p, r), k (B, S, H_kv, d),
premix (H_kv, r, d), norm weights (d,), cos/sin tables (B or 1, S, d). Outputs in [B, S, H, d] layout.

    u[b,s,g*H_p+i] = q_phys[b,s,i] @ premix[g]                  (group-major virtual heads)
    n = x / sqrt(mean(x^2) + eps) * w                            (RMSNorm over d)
    out = n * cos + rotate_half(n) * sin,  rotate_half(n) = [-n2, n1]
"""
from __future__ import annotations

import numpy as np


def _f64(x):
    return np.asarray(x, np.float64)


def rotate_half(x):
    h = x.shape[-1] // 2
    return np.concatenate([-x[..., h:], x[..., :h]], axis=-1)


def rotate_half_transpose(v):
    """Adjoint of rotate_half: <rotate_half(x), v> = <x, rotate_half_transpose(v)>."""
    h = v.shape[-1] // 2
    return np.concatenate([v[..., h:], -v[..., :h]], axis=-1)


def premix(q_phys, w):
    q_phys, w = _f64(q_phys), _f64(w)
    B, S, h_p, _ = q_phys.shape
    h_kv, _, d = w.shape
    out = np.empty((B, S, h_kv * h_p, d))
    for g in range(h_kv):
        for i in range(h_p):
            out[:, :, g * h_p + i] = q_phys[:, :, i] @ w[g]
    return out


def tables_for(cos, sin):
    """(B or 1, S, d) tables -> broadcastable (B or 1, S, 1, d)."""
    return _f64(cos)[:, :, None, :], _f64(sin)[:, :, None, :]


def forward(q_phys, k, premix_w, wq, wk, cos, sin, eps):
    c, s = tables_for(cos, sin)

    def norm_rope(x, w):
        n = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * _f64(w)
        return n * c + rotate_half(n) * s

    return norm_rope(premix(q_phys, premix_w), wq), norm_rope(_f64(k), wk)


def vjp(q_phys, k, premix_w, wq, wk, cos, sin, eps, g_q, g_k):
    """Gradients (q_phys, k, premix, wq, wk) of <forward_q, g_q> + <forward_k, g_k>."""
    c, s = tables_for(cos, sin)
    d = _f64(k).shape[-1]

    def norm_rope_vjp(x, w, g):
        w = _f64(w)
        rstd = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
        xhat = x * rstd
        gn = _f64(g) * c + rotate_half_transpose(_f64(g) * s)  # through out = n*cos + R(n)*sin
        gw = (gn * xhat).reshape(-1, d).sum(0)
        gxhat = gn * w
        # xhat = x * rstd: d xhat / dx = rstd (I - xhat xhat^T / d)
        gx = rstd * (gxhat - xhat * np.mean(gxhat * xhat, axis=-1, keepdims=True))
        return gx, gw

    u = premix(q_phys, premix_w)
    gu, gwq = norm_rope_vjp(u, wq, g_q)
    gk, gwk = norm_rope_vjp(_f64(k), wk, g_k)
    qp, w = _f64(q_phys), _f64(premix_w)
    h_kv = w.shape[0]
    h_p = qp.shape[2]
    gqp = np.zeros_like(qp)
    gw_p = np.zeros_like(w)
    for g in range(h_kv):
        for i in range(h_p):
            gj = gu[:, :, g * h_p + i]  # (B, S, d)
            gqp[:, :, i] += gj @ w[g].T
            gw_p[g] += np.einsum("bsr,bsd->rd", qp[:, :, i], gj)
    return gqp, gk, gw_p, gwq, gwk


def rope_tables(positions, d, theta):
    """Qwen3 default RoPE tables (B, S, d) for integer positions (B, S): concat(freqs, freqs)."""
    inv_freq = 1.0 / theta ** (np.arange(0, d, 2, dtype=np.float64) / d)
    ang = _f64(positions)[..., None] * inv_freq
    ang = np.concatenate([ang, ang], axis=-1)
    return np.cos(ang), np.sin(ang)


def round_bf16(x):
    """Round float values to bfloat16 (nearest even), returned as float32."""
    a = np.ascontiguousarray(np.asarray(x, np.float32))
    u = a.view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    return u.astype(np.uint32).view(np.float32)
