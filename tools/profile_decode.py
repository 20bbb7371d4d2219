#!/usr/bin/env python
"""Where a decode step's time goes in onnxruntime: an export's prefill, then --steps greedy decode steps under
onnxruntime's profiler, and per node type the kernel time and node count of a mean step, the step's wall time, and
what lies between the kernels (the executor, allocations, thread hand-offs). The profiler times every node, which
costs (SmolLM2 int4, batch 1, 128 positions: 19.3 ms a step profiled, 10-11 ms not): the same steps are timed again
without it, and the table is read for its shares.

    python tools/profile_decode.py runs/smol-int4                          # batch 1, a 1,320-token prompt
    python tools/profile_decode.py runs/smol-int4 --prompt 4096 --batch 8 --steps 8 --json profile.json

The prompt is --prompt random token ids below the model's vocabulary (decode time does not depend on them); the steps
feed back the greedy token. Threads: --threads (default: the cores this process may use). Prints the machine line
first (machines here differ); --json writes the table as data. Exit status: 0, or 2 with one line for a folder that is
not a whole export.
"""
from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import sys
import tempfile
import time

import numpy as np


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("export", help="a folder written by tools/export_onnx.py")
    p.add_argument("--prompt", type=int, default=1320, help="prompt tokens before the profiled steps (default 1320)")
    p.add_argument("--batch", type=int, default=1, help="rows (default 1)")
    p.add_argument("--steps", type=int, default=16, help="profiled decode steps (default 16)")
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)),
                   help="onnxruntime intra-op threads (default: the cores this process may use)")
    p.add_argument("--top", type=int, default=15, help="node types listed (default 15; the rest summed)")
    p.add_argument("--json", default=None, metavar="FILE", help="also write the table as JSON")
    args = p.parse_args(argv)
    if min(args.prompt, args.batch, args.steps, args.threads, args.top) < 1:
        p.error("--prompt, --batch, --steps, --threads and --top must be >= 1")
    return args


def step_windows(trace, steps: int):
    """[(start, end)] in µs of the last `steps` model_run events (the decode steps; the first is the prefill)."""
    runs = sorted((e["ts"], e["ts"] + e["dur"]) for e in trace if e.get("cat") == "Session" and e["name"] == "model_run")
    return runs[-steps:]


def per_op(trace, windows):
    """{op type: (kernel µs, node count)} summed over the windows."""
    out = collections.defaultdict(lambda: [0.0, 0])
    starts = np.array([w[0] for w in windows])
    for e in trace:
        if e.get("cat") != "Node" or not e["name"].endswith("_kernel_time"):
            continue
        k = np.searchsorted(starts, e["ts"], side="right") - 1
        if k < 0 or e["ts"] > windows[k][1]:
            continue  # the prefill's, or a warm-up's
        op = e.get("args", {}).get("op_name", "?")
        out[op][0] += e["dur"]
        out[op][1] += 1
    return out


def timed_steps(sess, ids, steps: int):
    """(prefill seconds, [step seconds]) of a prefill of `ids` and `steps` greedy steps."""
    t = time.perf_counter()
    logits, cache = sess.prefill(ids)
    prefill = time.perf_counter() - t
    walls = []
    for _ in range(steps):
        nxt = np.asarray(logits)[:, -1].argmax(-1)[:, None]
        t = time.perf_counter()
        logits, cache = sess.step(nxt, cache)
        walls.append(time.perf_counter() - t)
    return prefill, walls


def main(argv=None) -> int:
    args = parse_args(argv)
    from paddle_vha.cli import quiet
    from paddle_vha.machine import cpu_line
    from paddle_vha.serve.ort_session import OrtDecoder
    from paddle_vha.serve.session import ServeError

    quiet()
    with tempfile.TemporaryDirectory(prefix="profile-decode-") as tmp:
        try:
            sess = OrtDecoder.from_dir(args.export, threads=args.threads, profile=os.path.join(tmp, "trace"))
        except ServeError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        with open(os.path.join(args.export, "config.json")) as f:
            vocab = int(json.load(f)["vocab_size"])
        ids = np.random.default_rng(0).integers(0, vocab, (args.batch, args.prompt))
        prefill, walls = timed_steps(sess, ids, args.steps)
        sess.session.end_profiling()
        with open(glob.glob(os.path.join(tmp, "trace*.json"))[0]) as f:
            trace = json.load(f)
    # the profiler times every node, which costs: the same steps again without it, for the step's real time
    plain = OrtDecoder.from_dir(args.export, threads=args.threads)
    _, plain_walls = timed_steps(plain, ids, args.steps)
    del plain
    windows = step_windows(trace, args.steps)
    ops = per_op(trace, windows)
    run_us = sum(b - a for a, b in windows) / args.steps
    kernel_us = sum(v[0] for v in ops.values()) / args.steps
    rows = sorted(((op, v[0] / args.steps, v[1] / args.steps) for op, v in ops.items()), key=lambda r: -r[1])
    shown, rest = rows[:args.top], rows[args.top:]
    print(f"{cpu_line()}; {args.threads} threads; {args.export}: batch {args.batch}, prompt {args.prompt} (prefill "
          f"{prefill:.2f} s), {args.steps} steps: {1e3 * float(np.median(plain_walls)):.2f} ms a step unprofiled "
          f"(median; {args.batch / float(np.median(plain_walls)):.1f} tokens/s); profiled {1e3 * float(np.median(walls)):.2f} "
          f"ms: onnxruntime's run {run_us / 1e3:.2f} ms, kernels {kernel_us / 1e3:.2f} ms, between kernels "
          f"{(run_us - kernel_us) / 1e3:.2f} ms (the profiler's own cost is in both: read the shares)")
    print(f"{'node type':<32} {'ms / step':>9} {'share':>6} {'nodes':>6} {'µs / node':>9}")
    for op, us, n in shown + ([("(the other types)", sum(r[1] for r in rest), sum(r[2] for r in rest))]
                              if rest else []):
        print(f"{op:<32} {us / 1e3:9.3f} {us / kernel_us:6.1%} {n:6.0f} {us / max(n, 1):9.1f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": cpu_line(), "threads": args.threads, "batch": args.batch, "prompt": args.prompt,
                       "steps": args.steps, "prefill_s": prefill, "wall_ms": 1e3 * float(np.median(walls)),
                       "unprofiled_ms": 1e3 * float(np.median(plain_walls)),
                       "run_ms": run_us / 1e3, "kernel_ms": kernel_us / 1e3,
                       "ops": [{"op": op, "ms": us / 1e3, "nodes": n} for op, us, n in rows]}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
