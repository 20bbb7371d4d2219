"""The layer's composed prologue chain in PyTorch: what the fused kernels are compared with and timed against.
"""
from __future__ import annotations

import torch


def composed_torch(qp, k, W, wq, wk, cos, sin, eps):
    """The layer's composed chain in PyTorch, in the inputs' dtype ([B, S, H, d] layout)."""
    B, S, Hp, r = qp.shape
    Hkv, _, d = W.shape
    q = torch.matmul(qp, W.permute(1, 0, 2).reshape(r, Hkv * d))  # (B, S, H_p, H_kv*d)
    q = q.reshape(B, S, Hp, Hkv, d).permute(0, 1, 3, 2, 4).reshape(B, S, Hkv * Hp, d)  # group-major

    def rms(x, w):
        xf = x.float() if x.dtype != torch.float64 else x
        v = xf.pow(2).mean(-1, keepdim=True)
        return (xf * torch.rsqrt(v + eps)).to(x.dtype) * w

    def rot(x):
        h = x.shape[-1] // 2
        return torch.cat([-x[..., h:], x[..., :h]], -1)

    c, s = cos.unsqueeze(2), sin.unsqueeze(2)
    q, kk = rms(q, wq), rms(k, wk)
    return q * c + rot(q) * s, kk * c + rot(kk) * s
