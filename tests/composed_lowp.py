"""The composed prologue chain as a 16-bit framework runs it, simulated in numpy: the yardstick of the low-precision
tolerance policy (fused error at most ~2x the composed path's own error against float64).

Imports nothing from paddle_vha or paddle. Every tensor an op hands to the next op is rounded to the 16-bit dtype
(forward values and autograd's gradients alike); GEMMs and the RMSNorm statistics run in fp32 on those values, as
PaddleFormers' Qwen3 RMSNorm does (fp32 statistics, cast back, times the 16-bit weight). Same shapes and outputs as
the oracle's forward / vjp (tools/prologue_check/oracle.py): q_phys (B, S, H_p, r), k (B, S, H_kv, d), premix
(H_kv, r, d), tables (B or 1, S, d).
"""
from __future__ import annotations

import numpy as np


def rounder(dtype):
    """x -> x rounded to `dtype` (a numpy / ml_dtypes 16-bit type), returned as float32."""
    return lambda x: np.asarray(x, np.float32).astype(dtype).astype(np.float32)


def _rot(x):  # rotate_half: [-x2, x1]
    h = x.shape[-1] // 2
    return np.concatenate([-x[..., h:], x[..., :h]], axis=-1)


def _rot_t(v):  # its adjoint
    h = v.shape[-1] // 2
    return np.concatenate([v[..., h:], -v[..., :h]], axis=-1)


def forward_and_vjp(q_phys, k, premix_w, wq, wk, cos, sin, eps, g_q, g_k, dtype):
    """(q_out, k_out), (dq_phys, dk, dpremix, dwq, dwk) of the composed chain in `dtype`, outputs in (B, S, H, d)."""
    R = rounder(dtype)
    f = lambda x: R(np.asarray(x, np.float64))  # noqa: E731 - inputs as the framework holds them
    q_phys, k, W, wq, wk, cos, sin, g_q, g_k = map(f, (q_phys, k, premix_w, wq, wk, cos, sin, g_q, g_k))
    h_kv, h_p = W.shape[0], q_phys.shape[2]
    c, s = cos[:, :, None, :], sin[:, :, None, :]
    # u[b, s, g*H_p + i] = q_phys[b, s, i] @ W[g]: one GEMM per group, fp32 accumulation, 16-bit output
    u = R(np.concatenate([np.einsum("bsir,rd->bsid", q_phys, W[g]) for g in range(h_kv)], axis=2))

    def norm_rope(x, w, g):
        rstd = (1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + np.float32(eps))).astype(np.float32)
        xh = R(rstd * x)
        n = R(xh * w)
        out = R(R(n * c) + R(_rot(n) * s))
        # backward, each gradient tensor rounded where an op hands it on
        gn = R(R(g * c) + R(_rot_t(R(g * s))))
        gw = R((gn * xh).reshape(-1, x.shape[-1]).sum(0))
        gxh = R(gn * w)
        gx = R(rstd * gxh - x * rstd ** 3 * np.mean(gxh * x, axis=-1, keepdims=True))  # fp32 section, one cast
        return out, gx, gw

    q_out, gu, gwq = norm_rope(u, wq, g_q)
    k_out, gk, gwk = norm_rope(k, wk, g_k)
    gqp = np.zeros(q_phys.shape, np.float32)
    gW = np.zeros(W.shape, np.float32)
    for g in range(h_kv):
        gj = gu[:, :, g * h_p:(g + 1) * h_p]  # (B, S, H_p, d)
        gqp += np.einsum("bsid,rd->bsir", gj, W[g])
        gW[g] = R(np.einsum("bsir,bsid->rd", q_phys, gj))
    return (q_out, k_out), (R(gqp), gk, gW, gwq, gwk)
