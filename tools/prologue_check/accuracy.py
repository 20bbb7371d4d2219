"""The GPU check's correctness part: fused forward and backward against the float64 oracle on adversarial shapes, in
every dtype; in the 16-bit dtypes the fused error must be at most 2x the composed PyTorch chain's own (plus an ulp), in
float32 / float64 within the emulator suite's fixed bounds (tests/test_cuda_emulation.py: 4e-6 / 1e-11 relative; a
float32 sum of 256 products is ~6 ulp from float64 whatever the order, while cuBLAS's blocked sum can land at 2 ulp).
"""
from __future__ import annotations

import numpy as np
import torch

from . import oracle as po
from .launcher import DTYPES, Fused
from .torch_chain import composed_torch


ULP = {"float32": 2.0**-23, "float64": 2.0**-52, "bfloat16": 2.0**-8, "float16": 2.0**-10}
FIXED = {"float32": 4e-6, "float64": 1e-11}  # relative bounds of the full-precision dtypes


def rel(got, ref):
    got = got.detach().double().cpu().numpy() if torch.is_tensor(got) else got
    return float(np.abs(got - ref).max() / max(np.abs(ref).max(), 1e-30))


SHAPES = [  # (B, S, H_p, H_kv, r, d, position offset)
    (1, 1, 8, 2, 128, 128, 37),
    (2, 13, 4, 1, 64, 64, 0),
    (3, 7, 4, 2, 40, 64, 5),
    (2, 257, 8, 2, 128, 128, 0),
    (1, 5, 3, 3, 8, 8, 2),
    (2, 1031, 8, 2, 128, 128, 0),  # ~16K rows: every persistent tensor-core CTA loops over more than one 64-row tile
    (1, 19, 4, 1, 256, 256, 3),  # d = r = 256: a single q stage fits next to W[g] in shared memory
    (1, 33, 3, 3, 32, 256, 5),  # H_kv = 3, H_p = 3 (tiles straddle tokens), d = 256
]


def check(fused: Fused, results: list, device: str = "cuda", shapes=None) -> bool:
    """Every shape of `shapes` (default SHAPES) in every dtype; `device` 'cpu' runs it against the host emulator's
    build of the launcher (tests/test_gpu_check_harness.py)."""
    ok = True
    rng = np.random.default_rng(0)
    eps = 1e-6
    for shape in (SHAPES if shapes is None else shapes):
        B, S, Hp, Hkv, r, d, off = shape
        base = {
            "qp": rng.standard_normal((B, S, Hp, r)),
            "k": 2 * rng.standard_normal((B, S, Hkv, d)) + 0.5,
            "W": np.stack([np.eye(r, d) for _ in range(Hkv)]) + 0.2 * rng.standard_normal((Hkv, r, d)),
            "wq": 1 + 0.3 * rng.standard_normal(d),
            "wk": 1 + 0.3 * rng.standard_normal(d),
        }
        cos, sin = po.rope_tables(np.broadcast_to(np.arange(off, off + S), (B, S)), d, 1e6)
        base["cos"], base["sin"] = cos, sin
        g_q = rng.standard_normal((B, S, Hp * Hkv, d))
        g_k = rng.standard_normal((B, S, Hkv, d))
        for name, (_, tdt) in DTYPES.items():
            dev = {kk: torch.tensor(np.ascontiguousarray(v), dtype=tdt, device=device) for kk, v in base.items()}
            vals = {kk: v.double().cpu().numpy() for kk, v in dev.items()}  # the inputs as the GPU sees them
            gq_t, gk_t = torch.tensor(g_q, dtype=tdt, device=device), torch.tensor(g_k, dtype=tdt, device=device)
            args = [vals[n] for n in ("qp", "k", "W", "wq", "wk", "cos", "sin")]
            ref_q, ref_k = po.forward(*args, eps)
            ref_g = po.vjp(*args, eps, gq_t.double().cpu().numpy(), gk_t.double().cpu().numpy())
            targs = [dev[n] for n in ("qp", "k", "W", "wq", "wk", "cos", "sin")]
            hf = name in ("bfloat16", "float64")  # the attention layout [B, H, S, d] (what the layer uses)
            if hf:
                fq, fk = fused.forward(*targs, eps, heads_first=True)
                fq, fk = fq.transpose(1, 2), fk.transpose(1, 2)
                fg = fused.backward(*targs, gq_t.transpose(1, 2).contiguous(), gk_t.transpose(1, 2).contiguous(),
                                    eps, heads_first=True)
            else:
                fq, fk = fused.forward(*targs, eps)
                fg = fused.backward(*targs, gq_t, gk_t, eps)
            if device != "cpu":
                torch.cuda.synchronize()
            leaves = [t.clone().requires_grad_(True) for t in targs[:5]]
            cq, ck = composed_torch(*leaves, targs[5], targs[6], eps)
            cg = torch.autograd.grad([cq, ck], leaves, [gq_t, gk_t])
            labels = ["q", "k", "dq_phys", "dk", "dpremix", "dq_norm.w", "dk_norm.w"]
            for lab, f, c, ref in zip(labels, [fq, fk, *fg], [cq, ck, *cg], [ref_q, ref_k, *ref_g]):
                e_f, e_c = rel(f, ref), rel(c, ref)
                bound = FIXED[name] if name in FIXED else 2 * e_c + ULP[name]
                good = e_f <= bound
                ok &= good
                results.append(dict(shape=shape, dtype=name, out=lab, fused=e_f, composed=e_c, ok=good))
                if not good:
                    print(f"FAIL {shape} {name} {lab}: fused {e_f:.3e} composed {e_c:.3e} bound {bound:.3e}")
        print(f"[check] {shape} done", flush=True)
    return ok
