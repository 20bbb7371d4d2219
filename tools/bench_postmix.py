#!/usr/bin/env python
"""Postmix's two forms side by side on this CPU: low-rank (two GEMMs) vs dense (M = I + V U^T, one GEMM).

    bash tools/env.sh python tools/bench_postmix.py                    # 1.7B and 30B-A3B, 2048 tokens, 1 thread
    bash tools/env.sh python tools/bench_postmix.py --tokens 512 4096 --threads 2 --ranks 1 2 4 8 12 16 24

  low-rank (paddle_vha/vha/attention.py `postmix`):        Z = U^T Y (R x d per token), Y' = Y + V Z
  dense    (`postmix_dense`, upstream PaddleFleet's form): M = I + V U^T (H_v x H_v), Y' = M Y

Both on Y (1, tokens, H_v, d) float32 with U, V (H_v, R) as trainable parameters; "fwd" is the forward under
no_grad, "fwd+bwd" the forward with autograd plus the backward of a random output gradient (dY, dU, dV). Each figure is
the fastest of --repeat timed runs after 2 warm-ups (on a shared machine the least-disturbed run). The ratio is low-rank time / dense time (> 1: dense faster). The
max |difference| of the two outputs is printed per shape (float32 rounding). Shapes: the VHA article's 1.7B (d 128,
H_v 16, R 4) and 30B-A3B (H_v 48, R 12); --ranks adds rows at the 1.7B / 30B-A3B head counts with other ranks.
Then, unless --memory 0, selective recompute's saving on one whole Qwen3VHAAttention layer at both shapes (h 2048,
H_kv 2) in each form: the bytes held from the end of a training forward until the backward, with and without
recompute_modules ["vha_postmix"], read from Paddle's host-allocator counters (core.host_memory_stat_*: every CPU
tensor's allocation, nothing else), and the peak over forward + backward.
Memory: --memory S needs about 14·H_v·S² bytes at H_v 48 (the eager attention core's scores, probabilities and their
gradients; measured peak 0.94 GiB at 1.7B and 2.75 GiB at 30B-A3B, S = 2048), refused up front past MemAvailable.
The timing tensors of one shape, (3 + 2R / H_v) x tokens x H_v x d x 4 bytes plus autograd's saved copies (about
25 MB at 30B-A3B, 2048 tokens).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

from paddle_vha.cli import quiet
from paddle_vha.machine import available_memory_bytes

SHAPES = {"1.7B": dict(h_v=16, R=4, d=128), "30B-A3B": dict(h_v=48, R=12, d=128)}


def _parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog=__doc__.split("Memory: ")[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, nargs="+", default=[2048], help="tokens per call (B*S), default 2048")
    p.add_argument("--threads", type=int, default=1, help="CPU math threads (default 1: stable on a shared machine)")
    p.add_argument("--repeat", type=int, default=7, help="timed runs per figure (the fastest is shown), default 7")
    p.add_argument("--memory", type=int, default=2048, metavar="TOKENS",
                   help="also measure selective recompute's memory on one layer at TOKENS tokens (0: skip)")
    p.add_argument("--ranks", type=int, nargs="*", default=[], help="extra Postmix ranks at each shape's H_v")
    return p.parse_args(argv)


def _inputs(paddle, h_v, R, d, tokens, seed=0):
    paddle.seed(seed)
    y = paddle.randn([1, tokens, h_v, d], dtype="float32")
    u = paddle.create_parameter([h_v, R], "float32", default_initializer=paddle.nn.initializer.Normal(0.0, 0.3))
    v = paddle.create_parameter([h_v, R], "float32", default_initializer=paddle.nn.initializer.Normal(0.0, 0.3))
    return y, u, v


def _best_ms(fn, repeat):
    for _ in range(2):
        fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e3 * min(times)  # the least-disturbed run: the machine is shared


def measure(h_v, R, d, tokens, repeat):
    """{form: (fwd ms, fwd+bwd ms)} and the max |low-rank - dense| of the outputs."""
    import paddle
    from paddle_vha.vha.attention import postmix, postmix_dense

    y, u, v = _inputs(paddle, h_v, R, d, tokens)
    dy = paddle.randn(y.shape, dtype="float32")
    out = {}
    for name, form in (("lowrank", lambda a: postmix(a, u, v)), ("dense", lambda a: postmix_dense(a, u, v))):
        def fwd():
            with paddle.no_grad():
                form(y)

        def fwd_bwd():
            a = y.detach()
            a.stop_gradient = False
            paddle.autograd.backward([form(a)], [dy])
            u.clear_gradient()
            v.clear_gradient()

        out[name] = (_best_ms(fwd, repeat), _best_ms(fwd_bwd, repeat))
    with paddle.no_grad():
        diff = float((postmix(y, u, v) - postmix_dense(y, u, v)).abs().max())
    return out, diff


def _allocated():
    """(current, peak) bytes Paddle's host allocator has handed out: its own counters, so only tensors count."""
    from paddle.base import core

    return core.host_memory_stat_current_value("Allocated", 0), core.host_memory_stat_peak_value("Allocated", 0)


def layer_memory(h_v, R, d, tokens, form, recompute):
    """(bytes held from the end of a training forward of one Qwen3VHAAttention layer at this shape until its backward,
    output included; peak bytes above the start during forward + backward)."""
    import paddle
    from paddle.base import core
    from paddleformers.transformers.qwen3.modeling import Qwen3RotaryEmbedding
    from paddle_vha import Qwen3VHAAttention, Qwen3VHAConfig

    cfg = Qwen3VHAConfig(vocab_size=64, hidden_size=2048, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=h_v, num_key_value_heads=2, head_dim=d, vha_postmix_rank=R,
                         vha_postmix_form=form, vha_postmix_v_init_std=0.3, vha_fused_prologue=False)
    if recompute:
        cfg.recompute_granularity, cfg.recompute_modules = "selective", ["vha_postmix"]
    attn = Qwen3VHAAttention(cfg, 0)
    attn.train()
    x = paddle.randn([1, tokens, cfg.hidden_size])
    x.stop_gradient = False
    cos, sin = Qwen3RotaryEmbedding(cfg)(x, paddle.arange(tokens, dtype="int64")[None])
    mask = paddle.triu(paddle.full([tokens, tokens], float("-inf")), 1)[None, None]  # (1, 1, S, S) causal
    core.host_memory_stat_reset_peak_value("Allocated", 0)
    start = _allocated()[0]
    out, _ = attn(x, position_embeddings=(cos, sin), attention_mask=mask)
    held = _allocated()[0] - start
    paddle.autograd.backward([out], [paddle.ones_like(out)])
    return held, _allocated()[1] - start


def print_memory(tokens):
    print(f"\nselective recompute of Postmix (recompute_modules ['vha_postmix']): one attention layer, h 2048, H_kv 2, "
          f"{tokens} tokens, float32; bytes held from the end of the forward to the backward (the output included)")
    print(f"{'shape':<8} {'form':<8} | {'kept':>10} {'recomputed':>10} {'saved':>9} {'saved/token':>11} | "
          f"{'peak kept':>10} {'peak recomputed':>15}")
    for name, s in SHAPES.items():
        for form in ("lowrank", "dense"):
            (h0, p0), (h1, p1) = (layer_memory(s["h_v"], s["R"], s["d"], tokens, form, rc) for rc in (False, True))
            mib = lambda b: f"{b / 2**20:.2f} MiB"  # noqa: E731
            print(f"{name:<8} {form:<8} | {mib(h0):>10} {mib(h1):>10} {mib(h0 - h1):>9} {(h0 - h1) / tokens:>9.0f} B "
                  f"| {mib(p0):>10} {mib(p1):>15}", flush=True)


def _rows(args):
    for name, s in SHAPES.items():
        for R in [s["R"]] + [r for r in args.ranks if r != s["R"]]:
            for tokens in args.tokens:
                yield (name if R == s["R"] else f"{name} H_v, R={R}"), s["h_v"], R, s["d"], tokens


def main(argv=None) -> int:
    args = _parse(argv)
    if args.threads < 1 or args.repeat < 1 or min(args.tokens) < 1 or any(r < 1 for r in args.ranks) or args.memory < 0:
        print("bench_postmix: --threads, --repeat, --tokens and --ranks must be >= 1, --memory >= 0", file=sys.stderr)
        return 2
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):  # before Paddle loads
        os.environ[var] = str(args.threads)
    need = 14 * max(s["h_v"] for s in SHAPES.values()) * args.memory ** 2
    free = available_memory_bytes()
    if free is not None and need > free:
        print(f"bench_postmix: --memory {args.memory} needs about {need / 2**30:.1f} GiB (14·H_v·S² bytes), "
              f"{free / 2**30:.1f} GiB available: use fewer tokens", file=sys.stderr)
        return 2
    quiet()
    import paddle
    from paddle_vha.kernels.cpu_variant import cpu_isa_flags, cpu_model

    paddle.set_device("cpu")
    if hasattr(paddle, "set_num_threads"):  # not in every Paddle build
        paddle.set_num_threads(args.threads)
    print(f"CPU: {cpu_model()} | ISA: {cpu_isa_flags()} | threads {args.threads} | paddle {paddle.__version__} | "
          f"float32, fastest of {args.repeat}")
    print(f"{'shape':<22} {'H_v':>3} {'R':>3} {'tokens':>6} | {'low-rank fwd':>12} {'dense fwd':>9} {'ratio':>5} | "
          f"{'low-rank f+b':>12} {'dense f+b':>9} {'ratio':>5} | max|diff|")
    for name, h_v, R, d, tokens in _rows(args):
        t, diff = measure(h_v, R, d, tokens, args.repeat)
        (lf, lb), (df, db) = t["lowrank"], t["dense"]
        print(f"{name:<22} {h_v:>3} {R:>3} {tokens:>6} | {lf:>9.2f} ms {df:>6.2f} ms {lf / df:>5.2f} | "
              f"{lb:>9.2f} ms {db:>6.2f} ms {lb / db:>5.2f} | {diff:.1e}", flush=True)
    if args.memory:
        print_memory(args.memory)
    return 0


if __name__ == "__main__":
    sys.exit(main())
