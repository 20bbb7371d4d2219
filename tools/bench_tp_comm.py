#!/usr/bin/env python
"""Tensor-parallel communication of VHA's Postmix: low-rank all-reduce (this project) vs all-gather of the heads.

    bash tools/env.sh python tools/bench_tp_comm.py                      # bytes per token per layer, t = 2, 4, 8
    bash tools/env.sh python tools/bench_tp_comm.py --dtype float32 --tp 2 4
    python -m paddle.distributed.launch --nproc_per_node 2 --log_dir /tmp/tpb tools/bench_tp_comm.py --measure
                                                                          # + time both collectives on these ranks

Postmix mixes all H_v virtual heads, Y' = (I + V U^T) Y, but each rank holds H_v / t of them. Two ways to compute it:

  low-rank (paddle_vha.parallel):  Z = sum_k U_k^T Y_k is R x d per token: ONE all-reduce of R*d values,
                                   then Y'_k = Y_k + V_k Z locally. Backward: one all-reduce of R*d (dZ).
  all-gather:                      gather all H_v*d values of Y on every rank, apply M's rows locally.
                                   Backward: reduce-scatter of H_v*d.

"payload" is the tensor each rank hands to the collective; "sent per rank" is what a ring algorithm sends
(all-reduce 2(t-1)/t x payload, all-gather (t-1)/t x the gathered H_v*d, reduce-scatter the same). o_proj's
all-reduce of h values per token (row-parallel, as Qwen3) is the same in both designs and is shown for scale.
Shapes: the VHA article's 1.7B (h 2048, d 128, H_v 16 over H_kv 2, R 4) and 30B-A3B (48 virtual heads over 2 KV
heads, R 12; h 2048 and d 128 as Qwen3-30B-A3B).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

from paddle_vha.cli import quiet

SHAPES = {
    "1.7B": dict(h=2048, d=128, h_v=16, h_kv=2, R=4),
    "30B-A3B": dict(h=2048, d=128, h_v=48, h_kv=2, R=12),
}
BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


def per_token(shape: dict, t: int, nbytes: int) -> dict:
    """Bytes per token per layer, forward and backward, per rank."""
    h, d, h_v, R = shape["h"], shape["d"], shape["h_v"], shape["R"]
    ar = 2 * (t - 1) / t  # ring all-reduce: sent per rank / payload
    ag = (t - 1) / t  # ring all-gather / reduce-scatter: sent per rank / gathered size
    return {
        "lowrank_payload": R * d * nbytes,
        "lowrank_sent": ar * R * d * nbytes,
        "gather_payload": h_v * d * nbytes,
        "gather_sent": ag * h_v * d * nbytes,
        "o_proj_sent": ar * h * nbytes,
    }


def replicated_grad_values(shape: dict, t: int) -> int:
    """Values per layer whose gradient the plan all-reduces once per micro-batch (replicated, partly used per rank):
    q_proj, q_norm, k_norm; when t > H_kv also k_proj, v_proj and Premix (r = d)."""
    h, d, h_v, h_kv = shape["h"], shape["d"], shape["h_v"], shape["h_kv"]
    n = h * (h_v // h_kv) * d + 2 * d
    if t > h_kv:
        n += 2 * h * h_kv * d + h_kv * d * d
    return n


def fmt(n: float) -> str:
    if n >= 1 << 20:
        return f"{n / (1 << 20):.2f} MiB"
    return f"{n / 1024:.2f} KiB" if n >= 1024 else f"{n:.0f} B"


def table(tps, dtype: str) -> str:
    nb = BYTES[dtype]
    lines = [f"Postmix communication per token per layer, per rank, {dtype} activations "
             f"(forward; backward moves the same again)",
             f"{'shape':8s} {'t':>2s} | {'low-rank all-reduce':>21s} {'sent':>10s} | {'all-gather H_v*d':>23s} "
             f"{'sent':>10s} | {'payload ratio':>13s} {'sent ratio':>10s} | {'o_proj all-reduce sent':>22s}"]
    for name, shape in SHAPES.items():
        for t in tps:
            if shape["h_v"] % t:
                continue
            c = per_token(shape, t, nb)
            lines.append(
                f"{name:8s} {t:2d} | {'R*d = ' + str(shape['R'] * shape['d']):>11s} {fmt(c['lowrank_payload']):>8s} "
                f"{fmt(c['lowrank_sent']):>10s} | {'H_v*d = ' + str(shape['h_v'] * shape['d']):>12s} "
                f"{fmt(c['gather_payload']):>9s} {fmt(c['gather_sent']):>10s} | "
                f"{c['gather_payload'] / c['lowrank_payload']:>12.1f}x {c['gather_sent'] / c['lowrank_sent']:>9.1f}x | "
                f"{fmt(c['o_proj_sent']):>22s}")
    lines.append("payload ratio = H_v / R; sent ratio = H_v / (2R) (an all-reduce is a reduce-scatter plus an all-gather)")
    return "\n".join(lines)


def grad_table(tps, dtype: str, tokens: int) -> str:
    nb = BYTES[dtype]
    lines = [f"Replicated-parameter gradient all-reduce (q_proj, q/k norms; + k/v_proj, Premix when t > H_kv), once per "
             f"micro-batch per layer, {dtype} gradients, amortised over {tokens} tokens per micro-batch (per rank, sent)"]
    for name, shape in SHAPES.items():
        for t in tps:
            if shape["h_v"] % t:
                continue
            v = replicated_grad_values(shape, t)
            sent = 2 * (t - 1) / t * v * nb
            lines.append(f"{name:8s} t={t}: {v:,} values -> {fmt(sent)} per micro-batch, {fmt(sent / tokens)} per token")
    return "\n".join(lines)


def measure(tokens: int, repeats: int) -> None:
    """Time both designs' forward collective on the launched ranks and check they compute the same Y'."""
    import numpy as np
    import paddle
    import paddle.distributed as dist

    from paddle_vha.parallel.collectives import all_reduce_partial
    from paddle_vha.vha.attention import postmix

    dist.init_parallel_env()
    t, k = dist.get_world_size(), dist.get_rank()
    paddle.set_default_dtype("float32")
    for name, s in SHAPES.items():
        d, h_v, R = s["d"], s["h_v"], s["R"]
        if h_v % t:
            continue
        n = h_v // t
        rng = np.random.RandomState(0)
        y_all = paddle.to_tensor(rng.randn(1, tokens, h_v, d).astype("float32"))
        u = paddle.to_tensor(rng.randn(h_v, R).astype("float32") * 0.1)
        v = paddle.to_tensor(rng.randn(h_v, R).astype("float32") * 0.1)
        y, u_k, v_k = y_all[:, :, k * n:(k + 1) * n], u[k * n:(k + 1) * n], v[k * n:(k + 1) * n]

        def lowrank():
            z = all_reduce_partial(paddle.matmul(u_k, y, transpose_x=True))
            return y + paddle.matmul(v_k, z)

        def gather():  # forward only (what is timed): all-gather of every rank's heads
            parts = []
            dist.all_gather(parts, y.contiguous())
            full = paddle.concat(parts, axis=2)
            m_rows = paddle.eye(h_v)[k * n:(k + 1) * n] + paddle.matmul(v_k, u, transpose_y=True)  # rows of M
            return paddle.einsum("jk,bskd->bsjd", m_rows, full)

        ref = postmix(y_all, u, v)[:, :, k * n:(k + 1) * n]
        times = {}
        for label, fn in (("low-rank all-reduce", lowrank), ("all-gather", gather)):
            out = fn()
            err = float((out - ref).abs().max() / ref.abs().max())
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(repeats):
                fn()
            dist.barrier()
            times[label] = ((time.perf_counter() - t0) / repeats, err)
        if k == 0:
            for label, (sec, err) in times.items():
                print(f"measured {name:7s} t={t} {label:19s}: {sec * 1e3:8.2f} ms per call, {tokens} tokens, fp32 on "
                      f"{paddle.get_device()} (collective + local Postmix math; indicative only on a shared CPU); "
                      f"Y' vs single-device Postmix: rel err {err:.1e}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--tp", type=int, nargs="+", default=[2, 4, 8], help="tensor-parallel sizes (default 2 4 8)")
    ap.add_argument("--dtype", default="bfloat16", choices=sorted(BYTES), help="activation dtype (default bfloat16)")
    ap.add_argument("--measure", action="store_true", help="under paddle.distributed.launch: time both collectives")
    ap.add_argument("--tokens", type=int, default=4096,
                    help="tokens per micro-batch (gradient table) and per timed call (--measure); default 4096")
    ap.add_argument("--repeats", type=int, default=5, help="--measure: timed calls (default 5)")
    args = ap.parse_args(argv)
    quiet()
    if not args.measure or int(os.environ.get("PADDLE_TRAINER_ID", "0")) == 0:
        print(table(args.tp, args.dtype))
        print()
        print(grad_table(args.tp, args.dtype, args.tokens))
    if args.measure:
        measure(args.tokens, args.repeats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
