"""Benchmark (not a test): fused VHA prologue vs the layer's composed path on this CPU, and the floor.

    bash tools/env.sh python tools/bench_prologue.py                       # 1 thread, S = 1 128 2048 8192
    MKL_DEBUG_CPU_TYPE=5 bash tools/env.sh python tools/bench_prologue.py  # Paddle's MKL on its fast path (AMD)
    bash tools/env.sh python tools/bench_prologue.py --threads 2 --seqs 2048
    bash tools/env.sh python tools/bench_prologue.py --isa all             # every CPU kernel variant, side by side
    MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=100000000000 bash tools/env.sh python tools/bench_prologue.py

Large fresh outputs are slowed by page faults (glibc returns big blocks to the OS after each call): with
MALLOC_MMAP_MAX_=0 both paths reuse heap pages. The setting is printed with the results; compare like with like.

Shape: the 1.7B layer (H_p 8, H_kv 2, d = r = 128), batch 1, fp32. Both paths run through
`Qwen3VHAAttention.prologue` of the same layer (config.vha_fused_prologue False / True), in (B, H, S, d).
Forward, and forward + backward (gradients for q_phys, k, Premix and both norm weights).

The floor is measured in the same run: max(bytes moved / copy bandwidth, Premix FLOPs / GEMM rate), with
  bytes  fwd: read q_phys, k, cos, sin; write q, k.  bwd: read q_phys, k, cos, sin, dq, dk; write dq_phys, dk
  FLOPs  fwd: 2·N·H_p·r·H_kv·d (Premix);  fwd+bwd: 3x that (forward product, dq_phys and dPremix)
  copy bandwidth: numpy copy into an existing 256 MB buffer (bytes read + written)
  GEMM rate: the faster of numpy (OpenBLAS) and paddle.matmul (MKL), fp32, at the Premix shape
             (N·H_p, r) x (r, H_kv·d), N = 8192. OPENBLAS_CORETYPE=Haswell (set on some machines) slows numpy's
             kernel and MKL_DEBUG_CPU_TYPE unset slows MKL on AMD: both settings are printed; the strictest
             floor comes from `env -u OPENBLAS_CORETYPE MKL_DEBUG_CPU_TYPE=5`.
The op's CPU kernels come in variants (baseline x86-64, avx2 = x86-64-v3, avx512 = x86-64-v4), picked at run time
by CPUID; --isa runs the ones named (all: every variant this CPU can run) one after the other against the same
composed timings, by setting VHA_PROLOGUE_ISA. The CPU model, its vector ISA and the variant of each row are printed.
All timings are medians (or, with --stat min, minima) of repeated runs; ratios compare numbers measured side by side in this run.
"""
from __future__ import annotations

import argparse
import os
import sys
import time


def parse():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seqs", type=int, nargs="+", default=[1, 128, 2048, 8192])
    ap.add_argument("--threads", type=int, default=1, help="threads for the fused op, OpenBLAS and Paddle")
    ap.add_argument("--min-time", type=float, default=1.0, help="seconds of repeats per measurement (at least 3)")
    ap.add_argument("--stat", choices=["median", "min"], default="median",
                    help="statistic over repeats (min estimates the uncontended time on a shared, loaded machine)")
    ap.add_argument("--isa", nargs="+", default=["auto"], metavar="VARIANT",
                    help="CPU kernel variants to time: auto (what the op picks here), baseline, avx2, avx512, or all")
    return ap.parse_args()


args = parse()
# thread settings before numpy / paddle load their BLAS
os.environ["VHA_PROLOGUE_THREADS"] = str(args.threads)
os.environ.setdefault("OPENBLAS_NUM_THREADS", str(args.threads))
os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))

import numpy as np  # noqa: E402
import paddle  # noqa: E402

from paddleformers.transformers.qwen3.modeling import Qwen3RotaryEmbedding  # noqa: E402

from paddle_vha import Qwen3VHAAttention, Qwen3VHAConfig  # noqa: E402
from paddle_vha.kernels import cpu_variant as cv  # noqa: E402
from paddle_vha.kernels.op_loader import load_error, load_op  # noqa: E402

H_P, H_KV, D, R = 8, 2, 128, 128


def timeit(fn, min_time, min_reps=3):
    fn()  # warm-up (first-touch allocations, op load)
    times = []
    t_end = time.perf_counter() + min_time
    while len(times) < min_reps or time.perf_counter() < t_end:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
        if len(times) >= 200:
            break
    return float(np.min(times) if args.stat == "min" else np.median(times))


def copy_bandwidth():
    n = 256 * 2**20 // 4
    src = np.random.rand(n).astype(np.float32)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    t = timeit(lambda: np.copyto(dst, src), 0.5)
    return 2 * src.nbytes / t  # bytes read + written per second


def gemm_rates():
    """fp32 GEMM rates at the Premix shape: numpy (OpenBLAS) and paddle.matmul (bundled MKL)."""
    n = 8192 * H_P
    a = np.random.rand(n, R).astype(np.float32)
    b = np.random.rand(R, H_KV * D).astype(np.float32)
    out = np.empty((n, H_KV * D), np.float32)
    flops = 2.0 * n * R * H_KV * D
    t_np = timeit(lambda: np.matmul(a, b, out=out), 0.5)
    pa, pb = paddle.to_tensor(a), paddle.to_tensor(b)
    t_pd = timeit(lambda: paddle.matmul(pa, pb), 0.5)
    return flops / t_np, flops / t_pd


def main():
    paddle.set_device("cpu")
    try:
        paddle.set_num_threads(args.threads)  # not in every Paddle build
    except AttributeError:
        pass
    if load_op() is None:
        sys.exit(f"fused prologue unavailable: {load_error()}")
    have = cv.cpu_variants()
    isas = have if args.isa == ["all"] else [cv.cpu_variant() if v == "auto" else v for v in args.isa]
    for v in isas:
        if v not in have:
            sys.exit(f"--isa {v}: this CPU runs only {', '.join(have)}")
    cfg = Qwen3VHAConfig(hidden_size=2048, num_hidden_layers=1, head_dim=D, num_attention_heads=H_P * H_KV,
                         num_key_value_heads=H_KV, intermediate_size=6144, vocab_size=1000, rms_norm_eps=1e-6,
                         max_position_embeddings=65536)
    attn = Qwen3VHAAttention(cfg, 0)
    bw = copy_bandwidth()
    g_np, g_pd = gemm_rates()
    gflops = max(g_np, g_pd)  # the floor uses the faster library
    mkl = os.environ.get("MKL_DEBUG_CPU_TYPE", "unset")
    obc = os.environ.get("OPENBLAS_CORETYPE", "unset")
    mmap = os.environ.get("MALLOC_MMAP_MAX_", "unset")
    print(f"# threads {args.threads}; MKL_DEBUG_CPU_TYPE={mkl}; OPENBLAS_CORETYPE={obc}; MALLOC_MMAP_MAX_={mmap}; "
          f"fp32, B=1, H_p={H_P}, H_kv={H_KV}, d=r={D}")
    print(f"# copy bandwidth {bw / 1e9:.1f} GB/s (read+write); GEMM at the Premix shape: numpy {g_np / 1e9:.0f}, "
          f"paddle.matmul {g_pd / 1e9:.0f} GFLOP/s (floor uses {gflops / 1e9:.0f})")
    print(f"# CPU: {cv.cpu_model()}; vector ISA: {cv.cpu_isa_flags()}; kernel variants here: {', '.join(have)} "
          f"(auto picks {cv.cpu_variant()}); timed: {', '.join(isas)}")
    print(f"# load average at start: {os.getloadavg()[0]:.2f}; statistic over repeats: {args.stat}")
    rows = []
    for S in args.seqs:
        N = S
        q_phys = paddle.randn([1, S, H_P, R])
        k = paddle.randn([1, S, H_KV, D])
        cos, sin = Qwen3RotaryEmbedding(cfg)(q_phys, paddle.arange(S, dtype="int64")[None])
        g_q = paddle.randn([1, H_P * H_KV, S, D])
        g_k = paddle.randn([1, H_KV, S, D])
        q_phys.stop_gradient = k.stop_gradient = False

        def fwd(fused):
            attn.config.vha_fused_prologue = fused
            with paddle.no_grad():
                return attn.prologue(q_phys, k, cos, sin)

        def fwd_bwd(fused):
            attn.config.vha_fused_prologue = fused
            q, kk = attn.prologue(q_phys, k, cos, sin)
            paddle.autograd.backward([q, kk], [g_q, g_k])
            for t in (q_phys, k, attn.vha_premix_weight, attn.q_norm.weight, attn.k_norm.weight):
                t.clear_gradient(set_to_zero=False)

        f32 = 4
        io_f = f32 * (N * H_P * R + N * H_KV * D + 2 * N * D + N * H_P * H_KV * D + N * H_KV * D)
        io_b = f32 * (N * H_P * R + N * H_KV * D + 2 * N * D + N * H_P * H_KV * D + N * H_KV * D
                      + N * H_P * R + N * H_KV * D)
        fl_f = 2.0 * N * H_P * R * H_KV * D
        floor_f = max(io_f / bw, fl_f / gflops)
        floor_fb = max((io_f + io_b) / bw, 3 * fl_f / gflops)
        mt = args.min_time
        t = {"fc": timeit(lambda: fwd(False), mt), "bc": timeit(lambda: fwd_bwd(False), mt)}
        for v in isas:
            os.environ["VHA_PROLOGUE_ISA"] = v  # read by the op on every call
            t["ff", v], t["bf", v] = timeit(lambda: fwd(True), mt), timeit(lambda: fwd_bwd(True), mt)
        os.environ.pop("VHA_PROLOGUE_ISA", None)
        rows.append((S, t, floor_f, floor_fb))
        fused = "; ".join(f"{v} {t['ff', v] * 1e3:.3f} / {t['bf', v] * 1e3:.3f}" for v in isas)
        print(f"S={S}: composed fwd {t['fc'] * 1e3:.3f} ms / fwd+bwd {t['bc'] * 1e3:.3f} ms; fused {fused} ms",
              flush=True)

    print(f"# load average at end: {os.getloadavg()[0]:.2f}")
    print("\n|     S | pass    | variant  | composed ms | fused ms | composed/fused | floor ms | fused/floor |")
    print("| ----: | ------- | -------- | ----------: | -------: | -------------: | -------: | ----------: |")
    for S, t, ff, fb in rows:
        for name, c, key, fl in (("fwd", t["fc"], "ff", ff), ("fwd+bwd", t["bc"], "bf", fb)):
            for v in isas:
                f = t[key, v]
                print(f"| {S:5d} | {name:7s} | {v:8s} | {c * 1e3:11.3f} | {f * 1e3:8.3f} | {c / f:14.1f} | "
                      f"{fl * 1e3:8.3f} | {f / fl:11.2f} |")


if __name__ == "__main__":
    main()
