"""GPU check of the fused VHA prologue's CUDA kernels, for a machine with PyTorch and nvcc but no Paddle.

    python tools/gpu_check.py                        # build, check, time; short table last (< 5 min)
    python tools/gpu_check.py --skip-timing          # correctness only
    python tools/gpu_check.py --tokens 4096,16384    # time only these token counts
    python tools/gpu_check.py --json PATH            # also write the results (default: $OUT/gpu_check.json if $OUT)
    python tools/gpu_check.py --selftest-table       # no GPU: the bytes model and table on made-up timings

STATUS: written for the project's H200 check machine and NEVER RUN ON A GPU YET: the CUDA path is compiled but
unverified until this script has passed there (docs/prologue.md).

1. Builds ops/csrc/cuda/c_api.cu (the extern "C" launcher over the same kernels the Paddle op uses)
   with nvcc for this GPU's architecture, and loads it with ctypes.
2. Forward and backward vs the float64 numpy oracle (tests/prologue_oracle.py, which imports no Paddle) on
   adversarial shapes (S = 1 with a position offset, prime S, B > 1, r < d, H_kv = 1 / 2 / 3, d = 64 / 128),
   in float32, bfloat16, float16 and float64; in the low-precision dtypes the fused error must be at most
   2x the composed PyTorch chain's own error against float64 (plus one output ulp). The exit status is this
   check's (the speed targets below are reported, not enforced).
3. Times, at the 1.7B shape (B 1, H_p 8, H_kv 2, d = r = 128, bf16, [B, S, H, d] layout on both sides) for
   1 to 16K tokens: the fused forward, backward and forward + backward against the composed chain in PyTorch
   (composed_torch; its backward by torch.autograd.grad on given output gradients). Each function is warmed up
   outside capture, then 20 calls are captured into one torch.cuda.CUDAGraph and replayed back to back between
   CUDA events: per-call time = GPU time / calls, the median of several samples, host overhead excluded. If a
   capture fails, that function is timed by an event-timed loop of back-to-back eager calls instead (host
   overhead included) and the table's last column says so. Reports the fused forward's GB/s against this
   device's device-to-device copy bandwidth measured in the same run (bytes read + written, same method), and
   the fused backward's TFLOP/s on its 3 GEMMs; then the short table and one line per target (forward >= 75% of
   copy bandwidth at >= 4K tokens; forward + backward >= 2x faster than the composed chain).
"""
from __future__ import annotations

import argparse
import ctypes
import json
import math
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
           str(ROOT / "ops" / "csrc" / "cuda" / "c_api.cu"), "-o", str(so)]
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


def _code(t):
    return DTYPES[str(t.dtype).replace("torch.", "")][0]


class Fused:
    """The launcher on torch tensors, on torch's current stream. The *_into forms write into given buffers (no
    allocation: what the timing captures into CUDA graphs); forward / backward allocate their outputs."""

    def __init__(self, lib):
        self.lib = lib

    def forward_into(self, qp, k, W, wq, wk, cos, sin, qo, ko, eps, heads_first=False):
        B, S, Hp, r = qp.shape
        Hkv, _, d = W.shape
        rc = self.lib.vha_prologue_forward(_code(qp), ptr(qp), ptr(k), ptr(W), ptr(wq), ptr(wk), ptr(cos), ptr(sin),
                                           ptr(qo), ptr(ko), B, S, Hp, Hkv, r, d, cos.shape[0], eps,
                                           int(heads_first), stream())
        assert rc == 0, f"forward CUDA error {rc}"

    def forward(self, qp, k, W, wq, wk, cos, sin, eps, heads_first=False):
        B, S, Hp, r = qp.shape
        Hkv, _, d = W.shape
        shape_q = (B, Hp * Hkv, S, d) if heads_first else (B, S, Hp * Hkv, d)
        shape_k = (B, Hkv, S, d) if heads_first else (B, S, Hkv, d)
        qo = torch.empty(shape_q, dtype=qp.dtype, device=qp.device)
        ko = torch.empty(shape_k, dtype=qp.dtype, device=qp.device)
        self.forward_into(qp, k, W, wq, wk, cos, sin, qo, ko, eps, heads_first)
        return qo, ko

    def workspace(self, qp, W):
        """The backward's workspace (uint8 tensor of vha_prologue_backward_workspace bytes)."""
        B, S, Hp, r = qp.shape
        Hkv, _, d = W.shape
        ws = self.lib.vha_prologue_backward_workspace(_code(qp), B, S, Hp, Hkv, r, d)
        return torch.empty(ws, dtype=torch.uint8, device=qp.device)

    def backward_into(self, qp, k, W, wq, wk, cos, sin, gq, gk, outs, work, eps, heads_first=False):
        """outs: (d q_phys, d k, d premix, d q_norm.w, d k_norm.w), shaped like (qp, k, W, wq, wk)."""
        B, S, Hp, r = qp.shape
        Hkv, _, d = W.shape
        rc = self.lib.vha_prologue_backward(_code(qp), ptr(qp), ptr(k), ptr(W), ptr(wq), ptr(wk), ptr(cos),
                                            ptr(sin), ptr(gq), ptr(gk), *[ptr(o) for o in outs], ptr(work),
                                            work.numel(), B, S, Hp, Hkv, r, d, cos.shape[0], eps, int(heads_first),
                                            stream())
        assert rc == 0, f"backward CUDA error {rc}"

    def backward(self, qp, k, W, wq, wk, cos, sin, gq, gk, eps, heads_first=False):
        outs = [torch.empty_like(t) for t in (qp, k, W, wq, wk)]
        self.backward_into(qp, k, W, wq, wk, cos, sin, gq, gk, outs, self.workspace(qp, W), eps, heads_first)
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
    (2, 1031, 8, 2, 128, 128, 0),  # ~16K rows: every persistent tensor-core CTA loops over more than one 64-row tile
    (1, 19, 4, 1, 256, 256, 3),  # d = r = 256: a single q stage fits next to W[g] in shared memory
    (1, 33, 3, 3, 32, 256, 5),  # H_kv = 3, H_p = 3 (tiles straddle tokens), d = 256
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


# ---------------------------------------------------------------------------------------------------------------
# Timing. Every function is timed the same way (time_call): warm-up calls outside capture, then CALLS calls
# captured into one CUDA graph, replayed back to back between two CUDA events on the current stream; per-call
# time = GPU time / (replays * CALLS), the median of several samples. Host overhead (Python, ctypes, launch
# latency) is excluded because the GPU never waits for the host inside a sample. If capturing fails, the
# function is timed by a loop of back-to-back eager calls between events instead ("loop": host overhead
# included where the GPU work is shorter than the launch overhead) and the table says so.

CALLS = 20  # calls per captured graph
SAMPLE_MS = 1.0  # each sample is at least this much GPU time
SHAPE = dict(Hp=8, Hkv=2, r=128, d=128)  # the 1.7B shape
TOKENS = [1, 16, 256, 1024, 4096, 8192, 16384]
MEASURES = ["fused_fwd", "composed_fwd", "fused_bwd", "fused_fb", "composed_fb"]  # fb: forward + backward


def _events_ms(launch, reps: int) -> float:
    """GPU milliseconds of `reps` back-to-back launch() calls, between two events on the current stream."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        launch()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def _sample(launch, calls_per_launch: int, budget_s: float) -> float:
    """Median seconds per call over 3 to 7 samples of back-to-back launches (each >= SAMPLE_MS of GPU time)."""
    one = max(_events_ms(launch, 1), 1e-4)
    reps = max(1, min(200, math.ceil(SAMPLE_MS / one)))
    n = max(3, min(7, int(budget_s * 1e3 / (one * reps))))
    per_call = sorted(_events_ms(launch, reps) / (reps * calls_per_launch) for _ in range(n))
    return per_call[n // 2] / 1e3


def _capture(fn, calls: int, side) -> "torch.cuda.CUDAGraph":
    """`calls` calls of fn captured into one CUDA graph on the side stream; raises if the capture fails."""
    g = torch.cuda.CUDAGraph()
    err = None
    with torch.cuda.stream(side):
        try:  # relaxed: host-side calls of the launcher (cudaFuncSetAttribute, cudaGetDevice, ...) are allowed
            g.capture_begin(capture_error_mode="relaxed")
        except TypeError:  # torch < 2.1 has no capture_error_mode
            g.capture_begin()
        try:
            for _ in range(calls):
                fn()
        except Exception as e:  # reported by the caller, which falls back to a loop
            err = e
        finally:
            try:
                g.capture_end()
            except Exception as e:
                err = err or e
    if err is not None:
        raise RuntimeError(f"{type(err).__name__}: {err}")
    return g


def time_call(fn, calls: int = CALLS, budget_s: float = 0.3):
    """(seconds per call, method, why) for fn; method "graph" (CUDA graph of `calls` calls) or "loop"."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside capture: cuBLAS handles, lazily loaded kernels, autograd
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    try:
        g = _capture(fn, calls, side)
    except Exception as e:
        why = " ".join(str(e).split())[:300]
        torch.cuda.synchronize()
        try:  # a launch error the failed capture left behind is returned (and cleared) by one call
            fn()
        except Exception:
            pass
        torch.cuda.synchronize()
        return _sample(fn, 1, budget_s), "loop", f"capture failed: {why}"
    torch.cuda.synchronize()
    t = _sample(g.replay, calls, budget_s)
    del g
    return t, "graph", None


def copy_bandwidth(budget_s: float):
    """(bytes per second read + written by a device-to-device copy of 1 GiB, method)."""
    x = torch.empty(2**29, dtype=torch.bfloat16, device="cuda")
    y = torch.empty_like(x)
    t, method, why = time_call(lambda: y.copy_(x), calls=5, budget_s=budget_s)
    if why:
        print(f"[time] copy: {why}", flush=True)
    return 2 * x.numel() * x.element_size() / t, method


def model(tokens: int, Hp: int, Hkv: int, r: int, d: int, elem: int = 2, B: int = 1, Bc: int = 1) -> dict:
    """Bytes each pass must move at least once, and the backward's GEMM FLOPs (elem: bytes per element).

    inputs  = q_phys B*S*H_p*r + k B*S*H_kv*d + W H_kv*r*d + wq, wk 2*d + cos, sin 2*Bc*S*d
    outputs = q_out B*S*H_p*H_kv*d + k_out B*S*H_kv*d
    forward bytes  = elem * (inputs + outputs)                       (read each input once, write each output once)
    backward bytes = elem * (inputs + outputs + inputs - 2*Bc*S*d)   (inputs and the output gradients, sized like
                     the outputs, read once; gradients of q_phys, k, W, wq, wk written once; the fp32 workspace's
                     traffic is not counted)
    fwd+bwd bytes  = forward bytes + backward bytes
    backward GEMM FLOPs = 3 * 2*rows*r*d*H_kv, rows = B*S*H_p: recompute u = q W, dq = gu W^T, dW = q^T gu.
    """
    S = tokens
    inputs = B * S * Hp * r + B * S * Hkv * d + Hkv * r * d + 2 * d + 2 * Bc * S * d
    outputs = B * S * Hp * Hkv * d + B * S * Hkv * d
    grads = inputs - 2 * Bc * S * d
    fwd, bwd = elem * (inputs + outputs), elem * (inputs + outputs + grads)
    return dict(fwd_bytes=fwd, bwd_bytes=bwd, fb_bytes=fwd + bwd, bwd_gemm_flops=3 * 2 * B * S * Hp * r * d * Hkv)


def derive(row: dict, copy_gbps):
    """Adds speed-ups, GB/s, % of copy bandwidth and TFLOP/s to a row of *_us timings (None where unmeasured)."""
    m = model(row["tokens"], **SHAPE)
    row.update(m)

    def us(name):
        return row.get(name + "_us")

    def div(a, b):
        return a / b if a is not None and b else None

    row["fwd_speedup"] = div(us("composed_fwd"), us("fused_fwd"))
    row["fb_speedup"] = div(us("composed_fb"), us("fused_fb"))
    row["fwd_gbps"] = div(m["fwd_bytes"] / 1e3, us("fused_fwd"))  # bytes / us / 1e3 = GB/s
    row["fb_gbps"] = div(m["fb_bytes"] / 1e3, us("fused_fb"))
    row["copy_gbps"] = copy_gbps
    row["fwd_pct_copy"] = div(None if row["fwd_gbps"] is None else 100 * row["fwd_gbps"], copy_gbps)
    row["bwd_tflops"] = div(m["bwd_gemm_flops"] / 1e6, us("fused_bwd"))  # flops / us / 1e6 = TFLOP/s
    return row


def measure_shape(fused: Fused, N: int, budget_s: float, dev: str = "cuda") -> dict:
    Hp, Hkv, r, d = SHAPE["Hp"], SHAPE["Hkv"], SHAPE["r"], SHAPE["d"]
    eps, dt = 1e-6, torch.bfloat16
    qp = torch.randn(1, N, Hp, r, dtype=dt, device=dev)
    k = torch.randn(1, N, Hkv, d, dtype=dt, device=dev)
    W = (torch.eye(r, d, device=dev) + 0.1 * torch.randn(Hkv, r, d, device=dev)).to(dt)
    wq = torch.ones(d, dtype=dt, device=dev)
    wk = torch.ones(d, dtype=dt, device=dev)
    ang = torch.randn(1, N, d // 2, device=dev)
    cos, sin = torch.cat([ang, ang], -1).cos().to(dt), torch.cat([ang, ang], -1).sin().to(dt)
    gq = torch.randn(1, N, Hp * Hkv, d, dtype=dt, device=dev)
    gk = torch.randn(1, N, Hkv, d, dtype=dt, device=dev)
    # the fused path's outputs and workspace, allocated once outside the graphs
    qo = torch.empty(1, N, Hp * Hkv, d, dtype=dt, device=dev)
    ko = torch.empty(1, N, Hkv, d, dtype=dt, device=dev)
    gouts = [torch.empty_like(t) for t in (qp, k, W, wq, wk)]
    work = fused.workspace(qp, W)
    leaves = [t.clone().requires_grad_(True) for t in (qp, k, W, wq, wk)]

    def fused_fwd():
        fused.forward_into(qp, k, W, wq, wk, cos, sin, qo, ko, eps)

    def fused_bwd():
        fused.backward_into(qp, k, W, wq, wk, cos, sin, gq, gk, gouts, work, eps)

    def fused_fb():
        fused_fwd()
        fused_bwd()

    def composed_fwd():
        with torch.no_grad():
            composed_torch(qp, k, W, wq, wk, cos, sin, eps)

    def composed_fb():
        cq, ck = composed_torch(*leaves, cos, sin, eps)
        torch.autograd.grad([cq, ck], leaves, [gq, gk])

    fns = dict(fused_fwd=fused_fwd, composed_fwd=composed_fwd, fused_bwd=fused_bwd, fused_fb=fused_fb,
               composed_fb=composed_fb)
    row = dict(tokens=N, method={}, why={})
    for name in MEASURES:
        try:
            t, method, why = time_call(fns[name], budget_s=budget_s)
        except Exception as e:  # one failed measurement must not hide the others
            t, method, why = None, "failed", " ".join(f"{type(e).__name__}: {e}".split())[:300]
        row[name + "_us"] = None if t is None else t * 1e6
        row["method"][name] = method
        if why:
            row["why"][name] = why
            print(f"[time] N={N} {name}: {method} ({why})", flush=True)
    return row


def timing(fused: Fused, tokens, deadline: float, budget_s: float = 0.3):
    """(rows, copy GB/s, copy method); token counts not started before the deadline are marked skipped."""
    try:
        bw, copy_method = copy_bandwidth(budget_s)
        copy_gbps = bw / 1e9
        print(f"[time] device-to-device copy bandwidth {copy_gbps:.0f} GB/s (read + write, {copy_method})",
              flush=True)
    except Exception as e:
        copy_gbps, copy_method = None, "failed"
        print(f"[time] copy bandwidth not measured: {type(e).__name__}: {e}", flush=True)
    torch.cuda.empty_cache()
    rows = []
    for N in tokens:
        if time.time() > deadline:
            print(f"[time] N={N} skipped: over the time budget", flush=True)
            rows.append(derive(dict(tokens=N, method={n: "skipped" for n in MEASURES}, why={}), copy_gbps))
            continue
        t0 = time.time()
        rows.append(derive(measure_shape(fused, N, budget_s), copy_gbps))
        torch.cuda.empty_cache()
        print(f"[time] N={N} done in {time.time() - t0:.1f} s", flush=True)
    return rows, copy_gbps, copy_method


def _f(x, fmt):
    return "n/a" if x is None else format(x, fmt)


def _x(x):
    return "n/a" if x is None else f"{x:.2f}x"


def table_lines(rows, copy_gbps, copy_method) -> list:
    out = [f"1.7B shape (B 1, H_p 8, H_kv 2, r = d = 128), bf16; per-call GPU time; device-to-device copy "
           f"bandwidth {_f(copy_gbps, '.0f')} GB/s (read + write, {copy_method}); GB/s from model()'s bytes; "
           f"bwd TFLOP/s = 3 GEMMs of 2*rows*r*d*H_kv FLOPs over the fused backward's own time", "",
           "| tokens | fused fwd us | composed fwd us | fwd speed-up | fused fwd GB/s (% of copy) | fused fwd+bwd us "
           "| composed fwd+bwd us | fwd+bwd speed-up | bwd TFLOP/s | timing |",
           "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for r in rows:
        methods = r.get("method", {})
        other = [n for n in MEASURES if methods.get(n, "graph") != "graph"]
        how = "graph" if not other else "; ".join(f"{n} {methods[n]}" for n in other)
        pct = "" if r.get("fwd_pct_copy") is None else f" ({r['fwd_pct_copy']:.0f}%)"
        out.append(f"| {r['tokens']} | {_f(r.get('fused_fwd_us'), '.1f')} | {_f(r.get('composed_fwd_us'), '.1f')} | "
                   f"{_x(r.get('fwd_speedup'))} | {_f(r.get('fwd_gbps'), '.0f')}{pct} | "
                   f"{_f(r.get('fused_fb_us'), '.1f')} | {_f(r.get('composed_fb_us'), '.1f')} | "
                   f"{_x(r.get('fb_speedup'))} | {_f(r.get('bwd_tflops'), '.1f')} | {how} |")
    return out


def target_lines(rows) -> list:
    big = [r for r in rows if r["tokens"] >= 4096]
    if big:
        vals = [r.get("fwd_pct_copy") for r in big]
        met = all(v is not None and v >= 75 for v in vals)
        detail = ", ".join(f"{r['tokens']}: {_f(v, '.0f')}%" for r, v in zip(big, vals))
        t1 = f"target forward >= 75% of copy bandwidth at >= 4K tokens: {'MET' if met else 'NOT MET'} ({detail})"
    else:
        t1 = "target forward >= 75% of copy bandwidth at >= 4K tokens: NOT MEASURED (no token count >= 4096 timed)"
    vals = [r.get("fb_speedup") for r in rows]
    met = bool(rows) and all(v is not None and v >= 2 for v in vals)
    detail = ", ".join(f"{r['tokens']}: {_x(v)}" for r, v in zip(rows, vals)) or "nothing timed"
    t2 = (f"target forward+backward >= 2x faster than the composed chain (every token count timed): "
          f"{'MET' if met else 'NOT MET'} ({detail})")
    return [t1, t2]


def selftest_table(tokens):
    """The bytes model, derived columns, table and target lines on made-up timings (no GPU)."""
    copy_gbps = 4000.0
    rows = []
    for i, N in enumerate(tokens):
        m = model(N, **SHAPE)
        row = dict(tokens=N, method={n: "graph" for n in MEASURES}, why={})
        row["fused_fwd_us"] = max(3.0, m["fwd_bytes"] / 1e3 / 3200)
        row["composed_fwd_us"] = 4 * row["fused_fwd_us"] + 20
        row["fused_bwd_us"] = max(8.0, m["bwd_bytes"] / 1e3 / 2000)
        row["fused_fb_us"] = row["fused_fwd_us"] + row["fused_bwd_us"]
        row["composed_fb_us"] = 2.5 * row["fused_fb_us"] + 60
        if i == 1:
            row["method"]["composed_fb"] = "loop"
            row["why"]["composed_fb"] = "capture failed: made up"
        if i == 2:
            row["fused_bwd_us"] = row["fused_fb_us"] = None
            row["method"]["fused_bwd"] = row["method"]["fused_fb"] = "failed"
        rows.append(derive(row, copy_gbps))
    m = model(1, **SHAPE)
    # 1 token: inputs 8*128 + 2*128 + 2*128*128 + 2*128 + 2*128, outputs 16*128 + 2*128 (bf16: 2 bytes each)
    assert m["fwd_bytes"] == 2 * ((1024 + 256 + 32768 + 256 + 256) + (2048 + 256)), m
    assert m["bwd_gemm_flops"] == 3 * 2 * 8 * 128 * 128 * 2, m
    json.dumps(rows)
    for line in table_lines(rows, copy_gbps, "graph") + [""] + target_lines(rows):
        print(line)
    return 0


def parse_tokens(values) -> list:
    tokens = [int(x) for v in values for x in str(v).split(",") if x.strip()]
    if not tokens or min(tokens) < 1:
        raise ValueError(values)
    return tokens


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--skip-timing", action="store_true", help="correctness checks only")
    ap.add_argument("--tokens", nargs="+", default=None,
                    help=f"token counts to time, space- or comma-separated (default {','.join(map(str, TOKENS))})")
    ap.add_argument("--json", default=None, help="write the results here (default: $OUT/gpu_check.json if $OUT "
                                                 "is set, else not written)")
    ap.add_argument("--budget-s", type=float, default=280.0,
                    help="no new token count is timed after this many seconds from the start (default 280)")
    ap.add_argument("--selftest-table", action="store_true",
                    help="no GPU: print the table and target lines on made-up timings, then exit")
    args = ap.parse_args()
    try:
        tokens = parse_tokens(args.tokens) if args.tokens else TOKENS
    except ValueError:
        ap.error(f"--tokens wants positive integers, got {args.tokens}")
    if args.selftest_table:
        return selftest_table(tokens)
    t_start = time.time()
    print(f"[gpu] {torch.cuda.get_device_name()} capability {torch.cuda.get_device_capability()}, torch "
          f"{torch.__version__}", flush=True)
    fused = Fused(build_launcher(Path(tempfile.mkdtemp())))
    results = []
    ok = check(fused, results)
    rows, copy_gbps, copy_method = [], None, None
    if not args.skip_timing:
        rows, copy_gbps, copy_method = timing(fused, tokens, t_start + args.budget_s)
    targets = target_lines(rows) if rows else []
    json_path = args.json or (str(Path(os.environ["OUT"]) / "gpu_check.json") if os.environ.get("OUT") else None)
    if json_path:
        Path(json_path).write_text(json.dumps(dict(
            ok=ok, device=torch.cuda.get_device_name(), torch=torch.__version__, check=results,
            copy_gbps=copy_gbps, copy_method=copy_method, timing=rows, targets=targets,
            elapsed_s=time.time() - t_start), indent=1, default=str))
        print(f"[json] {json_path}")
    worst = {}
    for r in results:
        key = (r["dtype"], r["out"])
        worst[key] = max(worst.get(key, 0.0), r["fused"] / max(r["composed"], 1e-30))
    print("\nworst fused/composed error ratio per dtype and output (bound: 2, plus one ulp):")
    for dt in DTYPES:
        print(f"  {dt:9s} " + "  ".join(f"{o}={worst[(dt, o)]:.2f}" for o in
                                        ["q", "k", "dq_phys", "dk", "dpremix", "dq_norm.w", "dk_norm.w"]))
    print(f"\nRESULT (correctness): {'PASS' if ok else 'FAIL'} ({time.time() - t_start:.0f} s)")
    if rows:
        print()
        for line in table_lines(rows, copy_gbps, copy_method) + [""] + targets:
            print(line)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
