"""The GPU check's timing part: per-call GPU time of the fused and composed functions at the 1.7B shape.

Every function is timed the same way (time_call): warm-up calls outside capture, then CALLS calls
captured into one CUDA graph, replayed back to back between two CUDA events on the current stream; per-call
time = GPU time / (replays * CALLS), the median of several samples. Host overhead (Python, ctypes, launch
latency) is excluded because the GPU never waits for the host inside a sample. If capturing fails, the
function is timed by a loop of back-to-back eager calls between events instead ("loop": host overhead
included where the GPU work is shorter than the launch overhead) and the table says so.
"""
from __future__ import annotations

import math
import time

import torch

from .launcher import Fused
from .roofline import MEASURES, SHAPE, derive
from .torch_chain import composed_torch


CALLS = 20  # calls per captured graph
SAMPLE_MS = 1.0  # each sample is at least this much GPU time


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
