"""GPU check of the fused VHA prologue's CUDA kernels, for a machine with PyTorch and nvcc but no Paddle.

    python tools/gpu_check.py                 # build, check, time; prints a short table last (< 5 min)
    python tools/gpu_check.py --skip-timing   # correctness only

STATUS: written for the project's H200 check machine and NOT YET RUN: the CUDA path is compiled but
unverified until this script has passed there (docs/prologue.md).

1. Builds ops/csrc/vha_prologue_launcher.cu (the extern "C" launcher over the same kernels the Paddle op uses)
   with nvcc for this GPU's architecture, and loads it with ctypes.
2. Forward and backward vs the float64 numpy oracle (tests/prologue_oracle.py, which imports no Paddle) on
   adversarial shapes (S = 1 with a position offset, prime S, B > 1, r < d, H_kv = 1 / 2 / 3, d = 64 / 128),
   in float32, bfloat16, float16 and float64; in the low-precision dtypes the fused error must be at most
   2x the composed PyTorch chain's own error against float64 (plus one output ulp).
3. Times the fused forward (and forward + backward) against the composed chain in PyTorch eager at the 1.7B
   shape (H_p 8, H_kv 2, d = r = 128, bf16) for 1 to 16K tokens, and prints the fused forward's achieved GB/s
   against this device's measured copy bandwidth (torch clone: bytes read + written).
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent


def _load_oracle():
    """tests/prologue_oracle.py (numpy only), loaded by path: this machine has no paddle_vha installed."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("prologue_oracle", ROOT / "tests" / "prologue_oracle.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


po = _load_oracle()

DTYPES = {"float32": (0, torch.float32), "float64": (1, torch.float64), "bfloat16": (2, torch.bfloat16),
          "float16": (3, torch.float16)}
ULP = {"float32": 2.0**-23, "float64": 2.0**-52, "bfloat16": 2.0**-8, "float16": 2.0**-10}


def build_launcher(out_dir: Path) -> ctypes.CDLL:
    major, minor = torch.cuda.get_device_capability()
    arch = f"{major}{minor}"
    so = out_dir / f"libvha_prologue_sm{arch}.so"
    cmd = ["nvcc", "-O3", "-std=c++17", "-shared", "-Xcompiler", "-fPIC", "--expt-relaxed-constexpr",
           f"-gencode=arch=compute_{arch},code=sm_{arch}", f"-I{ROOT / 'ops' / 'csrc'}",
           str(ROOT / "ops" / "csrc" / "vha_prologue_launcher.cu"), "-o", str(so)]
    t0 = time.time()
    subprocess.run(cmd, check=True)
    print(f"[build] sm_{arch} launcher in {time.time() - t0:.1f} s: {so}", flush=True)
    lib = ctypes.CDLL(str(so))
    vp, L, F, I = ctypes.c_void_p, ctypes.c_long, ctypes.c_float, ctypes.c_int
    lib.vha_prologue_forward.argtypes = [I] + [vp] * 9 + [L] * 7 + [F, I, vp]
    lib.vha_prologue_forward.restype = I
    lib.vha_prologue_backward_workspace.argtypes = [I] + [L] * 6
    lib.vha_prologue_backward_workspace.restype = ctypes.c_size_t
    lib.vha_prologue_backward.argtypes = [I] + [vp] * 15 + [ctypes.c_size_t] + [L] * 7 + [F, I, vp]
    lib.vha_prologue_backward.restype = I
    return lib


def ptr(t):
    return ctypes.c_void_p(t.data_ptr()) if t is not None else ctypes.c_void_p(0)


def stream():
    return ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)


class Fused:
    def __init__(self, lib):
        self.lib = lib

    def forward(self, qp, k, W, wq, wk, cos, sin, eps, heads_first=False):
        B, S, Hp, r = qp.shape
        Hkv, _, d = W.shape
        shape_q = (B, Hp * Hkv, S, d) if heads_first else (B, S, Hp * Hkv, d)
        shape_k = (B, Hkv, S, d) if heads_first else (B, S, Hkv, d)
        qo = torch.empty(shape_q, dtype=qp.dtype, device=qp.device)
        ko = torch.empty(shape_k, dtype=qp.dtype, device=qp.device)
        code = DTYPES[str(qp.dtype).replace("torch.", "")][0]
        rc = self.lib.vha_prologue_forward(code, ptr(qp), ptr(k), ptr(W), ptr(wq), ptr(wk), ptr(cos), ptr(sin),
                                           ptr(qo), ptr(ko), B, S, Hp, Hkv, r, d, cos.shape[0], eps,
                                           int(heads_first), stream())
        assert rc == 0, f"forward CUDA error {rc}"
        return qo, ko

    def backward(self, qp, k, W, wq, wk, cos, sin, gq, gk, eps, heads_first=False):
        B, S, Hp, r = qp.shape
        Hkv, _, d = W.shape
        code = DTYPES[str(qp.dtype).replace("torch.", "")][0]
        ws = self.lib.vha_prologue_backward_workspace(code, B, S, Hp, Hkv, r, d)
        work = torch.empty(ws, dtype=torch.uint8, device=qp.device)
        outs = [torch.empty_like(t) for t in (qp, k, W, wq, wk)]
        rc = self.lib.vha_prologue_backward(code, ptr(qp), ptr(k), ptr(W), ptr(wq), ptr(wk), ptr(cos), ptr(sin),
                                            ptr(gq), ptr(gk), *[ptr(o) for o in outs], ptr(work), ws,
                                            B, S, Hp, Hkv, r, d, cos.shape[0], eps, int(heads_first), stream())
        assert rc == 0, f"backward CUDA error {rc}"
        return outs


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


def rel(got, ref):
    got = got.detach().double().cpu().numpy() if torch.is_tensor(got) else got
    return float(np.abs(got - ref).max() / max(np.abs(ref).max(), 1e-30))


SHAPES = [  # (B, S, H_p, H_kv, r, d, position offset)
    (1, 1, 8, 2, 128, 128, 37),
    (2, 13, 4, 1, 64, 64, 0),
    (3, 7, 4, 2, 40, 64, 5),
    (2, 257, 8, 2, 128, 128, 0),
    (1, 5, 3, 3, 8, 8, 2),
]


def check(fused: Fused, results: list) -> bool:
    ok = True
    rng = np.random.default_rng(0)
    eps = 1e-6
    for shape in SHAPES:
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
            dev = {kk: torch.tensor(v, dtype=tdt, device="cuda") for kk, v in base.items()}
            vals = {kk: v.double().cpu().numpy() for kk, v in dev.items()}  # the inputs as the GPU sees them
            gq_t, gk_t = torch.tensor(g_q, dtype=tdt, device="cuda"), torch.tensor(g_k, dtype=tdt, device="cuda")
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
            torch.cuda.synchronize()
            leaves = [t.clone().requires_grad_(True) for t in targs[:5]]
            cq, ck = composed_torch(*leaves, targs[5], targs[6], eps)
            cg = torch.autograd.grad([cq, ck], leaves, [gq_t, gk_t])
            labels = ["q", "k", "dq_phys", "dk", "dpremix", "dq_norm.w", "dk_norm.w"]
            for lab, f, c, ref in zip(labels, [fq, fk, *fg], [cq, ck, *cg], [ref_q, ref_k, *ref_g]):
                e_f, e_c = rel(f, ref), rel(c, ref)
                bound = 1e-11 if name == "float64" else 2 * e_c + ULP[name]
                good = e_f <= bound
                ok &= good
                results.append(dict(shape=shape, dtype=name, out=lab, fused=e_f, composed=e_c, ok=good))
                if not good:
                    print(f"FAIL {shape} {name} {lab}: fused {e_f:.3e} composed {e_c:.3e} bound {bound:.3e}")
        print(f"[check] {shape} done", flush=True)
    return ok


def time_cuda(fn, iters=None, budget_s=0.5):
    fn()
    torch.cuda.synchronize()
    t0 = time.time()
    fn()
    torch.cuda.synchronize()
    one = max(time.time() - t0, 1e-6)
    n = iters or max(3, min(200, int(budget_s / one)))
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(n):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1e3 / n


def copy_bandwidth():
    x = torch.empty(2**30 // 2, dtype=torch.bfloat16, device="cuda")
    y = torch.empty_like(x)
    t = time_cuda(lambda: y.copy_(x))
    return 2 * x.numel() * 2 / t


def timing(fused: Fused, rows: list):
    Hp, Hkv, d, r, eps = 8, 2, 128, 128, 1e-6
    bw = copy_bandwidth()
    print(f"[time] copy bandwidth {bw / 1e9:.0f} GB/s (read+write)", flush=True)
    for N in (1, 128, 1024, 4096, 16384):
        dt = torch.bfloat16
        qp = torch.randn(1, N, Hp, r, dtype=dt, device="cuda")
        k = torch.randn(1, N, Hkv, d, dtype=dt, device="cuda")
        W = (torch.eye(r, d, device="cuda") + 0.1 * torch.randn(Hkv, r, d, device="cuda")).to(dt)
        wq = torch.ones(d, dtype=dt, device="cuda")
        wk = torch.ones(d, dtype=dt, device="cuda")
        ang = torch.randn(1, N, d // 2, device="cuda")
        cos, sin = torch.cat([ang, ang], -1).cos().to(dt), torch.cat([ang, ang], -1).sin().to(dt)
        gq = torch.randn(1, N, Hp * Hkv, d, dtype=dt, device="cuda")
        gk = torch.randn(1, N, Hkv, d, dtype=dt, device="cuda")
        t_ff = time_cuda(lambda: fused.forward(qp, k, W, wq, wk, cos, sin, eps))
        t_fc = time_cuda(lambda: composed_torch(qp, k, W, wq, wk, cos, sin, eps))

        def fused_fb():
            fused.forward(qp, k, W, wq, wk, cos, sin, eps)
            fused.backward(qp, k, W, wq, wk, cos, sin, gq, gk, eps)

        leaves = [t.clone().requires_grad_(True) for t in (qp, k, W, wq, wk)]

        def comp_fb():
            cq, ck = composed_torch(*leaves, cos, sin, eps)
            torch.autograd.grad([cq, ck], leaves, [gq, gk])

        t_bf, t_bc = time_cuda(fused_fb), time_cuda(comp_fb)
        io = 2 * (N * Hp * r + N * Hkv * d + 2 * N * d + N * Hp * Hkv * d + N * Hkv * d)
        rows.append(dict(tokens=N, fwd_fused_ms=t_ff * 1e3, fwd_composed_ms=t_fc * 1e3, fb_fused_ms=t_bf * 1e3,
                         fb_composed_ms=t_bc * 1e3, fwd_gbps=io / t_ff / 1e9, copy_gbps=bw / 1e9))
        print(f"[time] N={N} done", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--skip-timing", action="store_true")
    args = ap.parse_args()
    t_start = time.time()
    print(f"[gpu] {torch.cuda.get_device_name()} capability {torch.cuda.get_device_capability()}, torch "
          f"{torch.__version__}", flush=True)
    out_dir = Path(os.environ.get("OUT") or tempfile.mkdtemp())
    fused = Fused(build_launcher(Path(tempfile.mkdtemp())))
    results, rows = [], []
    ok = check(fused, results)
    if not args.skip_timing:
        timing(fused, rows)
    (out_dir / "gpu_check.json").write_text(json.dumps(dict(ok=ok, check=results, timing=rows), indent=1,
                                                       default=str))
    worst = {}
    for r in results:
        key = (r["dtype"], r["out"])
        worst[key] = max(worst.get(key, 0.0), r["fused"] / max(r["composed"], 1e-30))
    print("\nworst fused/composed error ratio per dtype and output (bound: 2, plus one ulp):")
    for dt in DTYPES:
        print(f"  {dt:9s} " + "  ".join(f"{o}={worst[(dt, o)]:.2f}" for o in
                                        ["q", "k", "dq_phys", "dk", "dpremix", "dq_norm.w", "dk_norm.w"]))
    if rows:
        print("\n| tokens | fwd fused ms | fwd torch ms | speed-up | fwd GB/s | % of copy | fwd+bwd fused ms | "
              "fwd+bwd torch ms |")
        print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        for r in rows:
            print(f"| {r['tokens']} | {r['fwd_fused_ms']:.4f} | {r['fwd_composed_ms']:.4f} | "
                  f"{r['fwd_composed_ms'] / r['fwd_fused_ms']:.1f}x | {r['fwd_gbps']:.0f} | "
                  f"{100 * r['fwd_gbps'] / r['copy_gbps']:.0f}% | {r['fb_fused_ms']:.4f} | {r['fb_composed_ms']:.4f} |")
    print(f"\nRESULT: {'PASS' if ok else 'FAIL'} ({time.time() - t_start:.0f} s)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
