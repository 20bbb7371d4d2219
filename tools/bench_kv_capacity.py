#!/usr/bin/env python
"""How many cached positions fit in a memory budget, measured: for each KV cache (ours float32 / int8, llama.cpp f16 /
q8_0) and batch, the largest batch x context whose serving process (weights loaded, the cache allocated and filled,
one decode step of every row run over it) peaks at or under --budget-gb of resident memory.

    python tools/bench_kv_capacity.py WORK [--shape 1.7b] [--weights int4 --block-size 128] [--batch 1 8]
                                      [--caches fp32 int8] [--llama-kv f16 q8_0] [--budget-gb 24]

Nothing is computed from formulas: every number is a probe, one fresh process that loads the model, allocates its
cache for `batch` rows of `context` positions and runs one decode step over it, then reports its peak RSS (VmHWM).
Per cache and batch the search is: two small probes (--start and twice it) give the measured growth per position; the
largest context (a multiple of --granule) that growth puts under the budget is then probed itself, and stepped down by
a granule until a probe peaks under the budget (or stepped up while the next one still does). The answer printed is
the largest probed context that fit, with its measured peak, and the smallest probed that did not (if one was).

A probe that would pass this machine's available memory (MemAvailable, with --margin-gb to spare) is not started:
its row says so and shows the context the measured growth predicts, marked "predicted, not measured". On a machine
shared with other jobs run it where the budget is free (an idle 24 GB machine measures a 24 GB budget: --budget-gb 22
leaves the OS its share), one run at a time.

Ours: the export of --weights in the buffer flavour (the in-place cache paddle_vha.serve runs; WORK/<weights>-buffer
and its int8-cache copy WORK/<weights>-buffer-kvint8, written by tools/bench_serve_cpu.py's code and reused), the
cache buffers allocated at exactly the probed context plus one position (CacheBuffers.capacity_for rounds a growing
generation up by a quarter at most; a server sizes them once). llama.cpp (tools/llama_env.sh's .venv-llama): Q4_0
(tools/bench_llamacpp.py's GGUF) with one KV stream per row of context + 1 cells, type_k = type_v, flash attention.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from types import SimpleNamespace

import bench_llamacpp  # tools/ is the script's folder, first on the path
import bench_serve_cpu
from paddle_vha.machine import available_memory_bytes, cpu_line

OURS_PROBE = bench_llamacpp.PEAK_RSS + """
import json, sys
import numpy as np
from paddle_vha.serve.kv_cache import random_cache_fill
from paddle_vha.serve.ort_session import OrtDecoder
from paddle_vha.serve.session import CacheBuffers
folder, batch, context, threads = sys.argv[1], *map(int, sys.argv[2:5])
sess = OrtDecoder.from_dir(folder, threads)
rng = np.random.default_rng(0)
cache = sess.empty_cache(batch, context + 1)  # the buffer flavour: room for the step's own position
for buf, slot in zip(cache.buffers, cache.slots):
    random_cache_fill(slot, buf, context, rng)  # every page touched, as a prefill would
cache = CacheBuffers(cache.buffers, context, cache.slots)
logits, cache = sess.step(rng.integers(0, 1000, size=(batch, 1)), cache, np.ones((batch, context + 1), np.int64))
assert np.isfinite(logits).all() and cache.capacity == context + 1
print(json.dumps(dict(peak_rss=peak_rss(),
                      cache_bytes=cache.nbytes)))
"""

LLAMA_PROBE = bench_llamacpp.EXTRA_BUFTS_SWITCH + bench_llamacpp.PEAK_RSS + """
import json, sys
import numpy as np, llama_cpp as L
path, batch, context, threads, kv_type = sys.argv[1], *map(int, sys.argv[2:6])
L.llama_backend_init()
mp = L.llama_model_default_params()
mp.use_extra_bufts = os.environ.get("LLAMA_EXTRA_BUFTS") != "0"
model = L.llama_model_load_from_file(path.encode(), mp)
cp = L.llama_context_default_params()
cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_seq_max = batch * (context + 1), 512, 512, batch
cp.n_threads = cp.n_threads_batch = threads
cp.kv_unified = False
cp.type_k = cp.type_v = kv_type
cp.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_ENABLED
ctx = L.llama_init_from_model(model, cp)
if not ctx:
    raise SystemExit("llama_init_from_model failed (the cache did not fit)")
b = L.llama_batch_init(batch, 0, batch)
b.n_tokens = batch
for i in range(batch):  # one token a row at the last position: the step llama.cpp runs once the context is filled
    b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = 1 + i, context, 1, 1
    b.seq_id[i][0] = i
rc = L.llama_decode(ctx, b)
if rc:
    raise SystemExit(f"llama_decode: {rc}")
print(json.dumps(dict(peak_rss=peak_rss())))
"""


class Prober:
    """Runs the probes of one cache, remembering each measured peak."""

    def __init__(self, label, run, margin: float):
        self.label, self.run, self.margin = label, run, margin
        self.peaks = {}  # (batch, context) -> peak RSS bytes, or None where the probe failed

    def probe(self, batch: int, context: int, predicted_need: float = 0.0, log=print):
        """The peak RSS of one probe (None when it failed); "skipped" when `predicted_need` passes MemAvailable."""
        key = (batch, context)
        if key in self.peaks:
            return self.peaks[key]
        free = available_memory_bytes()
        if free is not None and predicted_need > free - self.margin:
            log(f"  {self.label} batch {batch} x {context}: not started (needs about {predicted_need / 1e9:.1f} GB, "
                f"MemAvailable {free / 1e9:.1f} GB)")
            return "skipped"
        t = time.time()
        res = self.run(batch, context)
        peak = None if res is None else res["peak_rss"]
        self.peaks[key] = peak
        log(f"  {self.label} batch {batch} x {context}: " + ("failed" if peak is None else
                                                             f"peak RSS {peak / 1e9:.2f} GB") +
            f" ({time.time() - t:.0f} s)")
        return peak


def search(prober: Prober, batch: int, args, log) -> dict:
    """For one cache and batch: fit (the largest probed context that peaked under the budget, its peak), miss (the
    smallest probed that did not, its peak or None for a failed probe), growth (measured bytes per position of the
    batch), predicted (the largest context the growth puts under the budget), note."""
    budget, granule = args.budget_gb * 1e9, args.granule
    row = dict(fit=None, miss=None, growth=None, predicted=None, note="measured")
    a, b = args.start, 2 * args.start
    pa = prober.probe(batch, a, log=log)
    if pa in (None, "skipped") or pa > budget:
        row.update(miss=(a, None if pa == "skipped" else pa), note="the smallest probe did not fit")
        return row
    row["fit"] = (a, pa)
    pb = prober.probe(batch, b, pa, log=log)
    if pb in (None, "skipped") or pb > budget:
        row.update(miss=(b, None if pb == "skipped" else pb))
        return row
    row["fit"] = (b, pb)
    growth = (pb - pa) / (b - a)
    base = pa - growth * a
    row.update(growth=growth, predicted=int((budget - base) / growth) if growth > 0 else None)
    context = max(b + granule, (row["predicted"] or b) // granule * granule)
    while context > row["fit"][0]:  # down from the prediction until a probe fits
        peak = prober.probe(batch, context, base + growth * context, log)
        if peak == "skipped":
            row["note"] = f"probes past {context - granule:,} not started here (MemAvailable): see predicted"
            context -= granule
            continue
        if peak is not None and peak <= budget:
            row["fit"] = (context, peak)
            break
        row["miss"] = (context, peak)
        context -= granule
    while row["miss"] is None or row["miss"][0] > row["fit"][0] + granule:  # then up while the next one fits
        nxt = row["fit"][0] + granule
        peak = prober.probe(batch, nxt, base + growth * nxt, log)
        if peak == "skipped":
            row["note"] = f"the probe at {nxt:,} not started here (MemAvailable): see predicted"
            break
        if peak is None or peak > budget:
            row["miss"] = (nxt, peak)
            break
        row["fit"] = (nxt, peak)
    return row


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("work", help="folder for the checkpoint and the exports (tools/bench_serve_cpu.py's; reused)")
    p.add_argument("--shape", default="1.7b", choices=["0.6b", "1.7b"])
    p.add_argument("--layers", type=int, default=None, help="decoder layers of the written checkpoint (default all)")
    p.add_argument("--kv-heads", type=int, default=2, help="KV heads of the written checkpoint (default 2, GQA-2)")
    p.add_argument("--weights", default="int4", choices=["fp32", "int8", "int4"])
    p.add_argument("--block-size", type=int, default=128, help="MatMulNBits block of int8 / int4 (default 128)")
    p.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    p.add_argument("--caches", nargs="*", default=["fp32", "int8"], choices=["fp32", "int8"], help="ours")
    p.add_argument("--llama-kv", nargs="*", default=["f16", "q8_0"], choices=["f16", "q8_0"],
                   help="llama.cpp Q4_0's caches (none: no llama.cpp rows)")
    p.add_argument("--budget-gb", type=float, default=24.0, help="peak resident memory allowed (GB = 1e9 bytes)")
    p.add_argument("--margin-gb", type=float, default=1.0, help="MemAvailable a probe leaves free (default 1)")
    p.add_argument("--start", type=int, default=1024, help="the first probe's context (the second: twice it)")
    p.add_argument("--granule", type=int, default=1024, help="contexts probed are multiples of this")
    args = p.parse_args(argv)
    if min(args.batch + [args.start, args.granule]) < 1 or args.budget_gb <= 0:
        p.error("--batch, --start, --granule must be >= 1 and --budget-gb > 0")
    from paddle_vha.cli import quiet

    quiet()
    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    threads = len(os.sched_getaffinity(0))
    opts = SimpleNamespace(work=args.work, checkpoint=None, shape=args.shape, layers=args.layers,
                           kv_heads=args.kv_heads, formats=[args.weights], block_size=[args.block_size],
                           kv_caches=args.caches or ["fp32"], cache="buffer", no_genai=True, genai_formats=[])
    os.makedirs(args.work, exist_ok=True)
    ckpt, ours, _ = bench_serve_cpu.prepare(opts, log)
    probers = []
    for (key, kv), folder in ours.items():
        if kv in args.caches:
            probers.append(Prober(f"ours {bench_serve_cpu.label(opts, key)}, {kv} cache", lambda b, c, f=folder:
                                  bench_serve_cpu.run_json(sys.executable, OURS_PROBE, [f, b, c, threads], log=log),
                                  args.margin_gb * 1e9))
    env = bench_llamacpp.llama_env() if args.llama_kv else None
    if args.llama_kv and env is None:
        log("llama.cpp: not probed (.venv-llama missing: bash tools/llama_env.sh)")
    elif env is not None:
        path = bench_llamacpp.prepare_gguf(args.work, ckpt, ["Q4_0"], env, log)["Q4_0"]
        for kv in args.llama_kv:
            def run(b, c, kv_type=bench_llamacpp.KV_TYPES[kv][0]):
                r, _ = bench_llamacpp.run_side(env[0], LLAMA_PROBE, [path, b, c, threads, kv_type], log)
                if r.returncode != 0:
                    log(f"  failed: {(r.stderr.strip().splitlines() or ['?'])[-1][:300]}")
                    return None
                return json.loads(r.stdout.strip().splitlines()[-1])
            probers.append(Prober(f"llama.cpp Q4_0, {kv} cache, FA", run, args.margin_gb * 1e9))
    rows = []
    for prober in probers:
        for batch in args.batch:
            log(f"{prober.label}, batch {batch}")
            rows.append((prober.label, batch, search(prober, batch, args, log)))
    cfg = json.load(open(os.path.join(ckpt, "config.json")))
    print(f"\n{cpu_line()}; Qwen3 {args.shape} shape ({cfg['num_hidden_layers']} layers, {cfg['num_key_value_heads']} "
          f"KV heads of {cfg['head_dim']}), {args.weights} weights; budget {args.budget_gb:g} GB of peak RSS (weights, "
          "cache filled, one decode step of every row)")
    hdr = (f"{'cache':<32} | {'batch':>5} | {'largest context':>15} | {'batch x context':>15} | {'its peak':>8} | "
           f"{'first miss':>16} | {'KB/pos/row':>10} | {'predicted':>9} | note")
    print(hdr)
    print("-" * len(hdr))
    for label, batch, r in rows:
        fit, miss = r["fit"], r["miss"]
        fit_s = f"{fit[0]:>15,}" if fit else f"{'none':>15}"
        bxc = f"{batch * fit[0]:>15,}" if fit else f"{'-':>15}"
        peak = f"{fit[1] / 1e9:>5.2f} GB" if fit else f"{'-':>8}"
        miss_s = f"{miss[0]:,} ({'failed' if miss[1] is None else f'{miss[1] / 1e9:.1f} GB'})" if miss else "-"
        grow = f"{r['growth'] / batch / 1e3:>10.1f}" if r["growth"] else f"{'-':>10}"
        pred = f"{r['predicted']:>9,}" if r["predicted"] else f"{'-':>9}"
        print(f"{label:<32} | {batch:>5} | {fit_s} | {bxc} | {peak} | {miss_s:>16} | {grow} | {pred} | {r['note']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
