#!/usr/bin/env python
"""How many cached positions fit in a memory budget, measured: for each KV cache (ours float32 / int8, llama.cpp f16 /
q8_0) and context, the largest batch whose serving process (weights loaded, every row's cache allocated and filled,
one decode step of every row run over it) peaks at or under --budget-gb of resident memory: batch x context.

    python tools/bench_kv_capacity.py WORK [--shape 1.7b] [--weights int4 --block-size 128]
                                      [--contexts 4096 16384 40959] [--caches fp32 int8] [--llama-kv f16 q8_0]
                                      [--budget-gb 24]

Nothing is computed from formulas: every number is a probe, one fresh process that loads the model, allocates its
cache for `batch` rows of `context` positions and runs one decode step over it, then reports its peak RSS (VmHWM).
Per cache and context the search probes batches 1 and 2 (doubling on while the peak stays flat: loading the model,
not the cache, can set it at a few rows), probes just under the batch their growth per row predicts,
steps up from a fit or down from a miss (1/16 of the batch, doubling) until it holds a probe that peaked over the
budget (or failed to allocate) and one that did not, then halves the gap until they are within 1/16 of each other:
4-6 probes where doubling from 1 took ~13. The answer printed is the largest probed batch that fit, with its
measured peak, and the smallest probed that did not; beside them the growth per row of the two largest fits and the
batch that growth would allow ("predicted", for scale only). A context is below the model's
max_position_embeddings (Qwen3: 40,960, its rotary tables' end; the decode step takes one more position: 40,959
at most).

A probe that would pass this machine's available memory (MemAvailable, with --margin-gb to spare, as the fits so far
predict it) is not started: the row says so, and its answer is the largest that was probed. On a machine
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


GROWTH_SHARE = 0.02  # a peak that grew by less than this share from the batch before is not yet led by the cache
STEADY_SHARE = 0.25  # past a flat start, two doublings whose growth per row agree this closely lead the search
LLAMA_MAX_SEQUENCES = 256  # llama.cpp's LLAMA_MAX_SEQ: a context with more sequences is refused


class Prober:
    """Runs the probes of one cache, remembering each measured peak."""

    def __init__(self, label, run, margin: float, max_batch: int = None):
        self.label, self.run, self.margin, self.max_batch = label, run, margin, max_batch  # max_batch: runtime's limit
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


def search(prober: Prober, context: int, args, log, max_batch: int = None) -> dict:
    """For one cache and context: fit (the largest probed batch that peaked under the budget, its peak), miss (the
    smallest probed that did not: its peak, or None for a failed probe), growth (bytes per row, from the two largest
    fits), predicted (the batch that growth puts under the budget), probes (how many ran), note.

    Every answer is a probe; the prediction only chooses where to probe. Batches 1 and 2 give the growth per row and
    the batch it predicts (while the peak stays flat, loading rather than the cache setting it, the batch doubles
    until it grows, and on until two doublings grow alike); the search probes just under that prediction, then gallops (steps of 1/16 of the batch,
    doubling) up from a fit or down from a miss until it holds a fit and a miss, then halves the gap until they are
    within 1/16 of each other (or adjacent). max_batch: the runtime's own limit (llama.cpp: 256 sequences): a fit
    there ends the search, noted."""
    budget = args.budget_gb * 1e9
    row = dict(fit=None, miss=None, growth=None, predicted=None, probes=0, note="measured")
    fits = []

    def need(batch):  # what the fits so far predict a probe of `batch` rows holds (0: nothing known yet)
        if len(fits) < 2:
            return 0.0
        (a, pa), (b, pb) = sorted(fits)[-2:]
        return pb + (pb - pa) / (b - a) * (batch - b)

    def probe(batch):
        """True (fit), False (miss) or None (not started: MemAvailable)."""
        before = len(prober.peaks)
        peak = prober.probe(batch, context, need(batch), log)
        row["probes"] += len(prober.peaks) - before
        if peak == "skipped":
            row["note"] = f"batches from {batch} on not started here (MemAvailable): see predicted"
            return None
        if peak is None or peak > budget:
            if row["miss"] is None or batch < row["miss"][0]:
                row["miss"] = (batch, peak)
            return False
        fits.append((batch, peak))
        if row["fit"] is None or batch > row["fit"][0]:
            row["fit"] = (batch, peak)
        return True

    def grows(fit_a, fit_b):
        """Whether the peak grew from one fit to the next by a measurable share: a process's peak can be its loading
        (onnxruntime's copy of the weights) until enough rows of cache pass it, which flat peaks say nothing about."""
        return fit_b[1] - fit_a[1] > GROWTH_SHARE * fit_b[1]

    def steady(fit_a, fit_b, fit_c):
        """Whether the growth per row held from one doubling to the next (within STEADY_SHARE): past a flat start the
        first rise is only part of a row's bytes (the rows fill the loading's peak before they pass it)."""
        ab, bc = (fit_b[1] - fit_a[1]) / (fit_b[0] - fit_a[0]), (fit_c[1] - fit_b[1]) / (fit_c[0] - fit_b[0])
        return abs(bc - ab) <= STEADY_SHARE * bc

    def close_enough(lo, hi):
        return hi - lo <= max(1, lo // 16)

    lo = hi = None  # the largest fit and the smallest miss so far
    batch = 1
    while True:  # batches 1, 2, then doubling while the peak does not yet grow with the rows
        ok = probe(batch)
        if ok is None:
            return _finish(row, fits, budget)
        if not ok:
            hi = batch
            break
        lo = batch
        if len(fits) >= 2 and grows(*fits[-2:]) and (len(fits) == 2 or steady(*fits[-3:])):
            break
        if max_batch and batch >= max_batch:
            row["note"] = f"the runtime's limit: {max_batch} rows"
            return _finish(row, fits, budget)
        batch = min(2 * batch, max_batch) if max_batch else 2 * batch
    if hi is None:
        (a, pa), (b, pb) = fits[-2:]
        growth = (pb - pa) / (b - a)  # bytes a row
        guess = max(b + 1, int(b + (budget - pb) / growth * 0.98))  # just under the prediction: the fit is probed first
        if max_batch:
            guess = min(guess, max_batch)
        ok = probe(guess)
        if ok is None:
            return _finish(row, fits, budget)
        step = max(1, guess // 16)
        if ok:
            lo = guess
            while hi is None:  # gallop up from the fit
                if max_batch and lo >= max_batch:
                    row["note"] = f"the runtime's limit: {max_batch} rows"
                    return _finish(row, fits, budget)
                nxt = lo + step if not max_batch else min(lo + step, max_batch)
                ok = probe(nxt)
                if ok is None:
                    return _finish(row, fits, budget)
                lo, hi = (nxt, None) if ok else (lo, nxt)
                step *= 2
        else:
            hi = guess
            while True:  # gallop down from the miss
                nxt = max(lo, hi - step)
                if nxt == lo:
                    break
                ok = probe(nxt)
                if ok is None:
                    return _finish(row, fits, budget)
                if ok:
                    lo = nxt
                    break
                hi = nxt
                step *= 2
    while lo is not None and hi is not None and not close_enough(lo, hi):  # halve the gap
        mid = (lo + hi) // 2
        ok = probe(mid)
        if ok is None:
            break
        lo, hi = (mid, hi) if ok else (lo, mid)
    return _finish(row, fits, budget)


def _finish(row: dict, fits, budget: float) -> dict:
    """Adds growth and predicted (from the two largest fits) and the note for no fit at all."""
    if len(fits) >= 2:
        (a, pa), (b, pb) = sorted(fits)[-2:]
        if pb > pa:
            row["growth"] = (pb - pa) / (b - a)
            row["predicted"] = int(b + (budget - pb) / row["growth"])
    if row["fit"] is None:
        row["note"] = "one row did not fit"
    return row

DEFAULT_CONTEXTS = (4096, 16384, 40959)  # 40,959: Qwen3's 40,960 positions less the step's own


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("work", help="folder for the checkpoint and the exports (tools/bench_serve_cpu.py's; reused)")
    p.add_argument("--shape", default="1.7b", choices=["0.6b", "1.7b"])
    p.add_argument("--layers", type=int, default=None, help="decoder layers of the written checkpoint (default all)")
    p.add_argument("--kv-heads", type=int, default=2, help="KV heads of the written checkpoint (default 2, GQA-2)")
    p.add_argument("--weights", default="int4", choices=["fp32", "int8", "int4"])
    p.add_argument("--block-size", type=int, default=128, help="MatMulNBits block of int8 / int4 (default 128)")
    p.add_argument("--contexts", type=int, nargs="+", default=list(DEFAULT_CONTEXTS),
                   help=f"positions per row (default {' '.join(map(str, DEFAULT_CONTEXTS))}: below the shape's positions, "
                        "a step needs one more)")
    p.add_argument("--caches", nargs="*", default=["fp32", "int8"], choices=["fp32", "int8"], help="ours")
    p.add_argument("--llama-kv", nargs="*", default=["f16", "q8_0"], choices=["f16", "q8_0"],
                   help="llama.cpp Q4_0's caches (none: no llama.cpp rows)")
    p.add_argument("--budget-gb", type=float, default=24.0, help="peak resident memory allowed (GB = 1e9 bytes)")
    p.add_argument("--margin-gb", type=float, default=1.0, help="MemAvailable a probe leaves free (default 1)")
    args = p.parse_args(argv)
    if min(args.contexts) < 1 or args.budget_gb <= 0:
        p.error("--contexts must be >= 1 and --budget-gb > 0")
    from fixtures.qwen3_shaped import qwen3_config

    positions = qwen3_config(args.shape)["max_position_embeddings"]  # checked before minutes of checkpoint and exports
    if max(args.contexts) >= positions:
        p.error(f"--contexts past the {args.shape} shape's {positions} positions (a step needs one more)")
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
                    log(f"  failed: {bench_serve_cpu.failure_line(r)}")
                    return None
                return json.loads(r.stdout.strip().splitlines()[-1])
            probers.append(Prober(f"llama.cpp Q4_0, {kv} cache, FA", run, args.margin_gb * 1e9,
                                  max_batch=LLAMA_MAX_SEQUENCES))
    cfg = json.load(open(os.path.join(ckpt, "config.json")))
    if max(args.contexts) >= cfg["max_position_embeddings"]:
        log(f"error: --contexts past the model's {cfg['max_position_embeddings']} positions (a step needs one more)")
        return 2
    rows = []
    for prober in probers:
        for context in args.contexts:
            log(f"{prober.label}, context {context}")
            rows.append((prober.label, context, search(prober, context, args, log, prober.max_batch)))
    print(f"\n{cpu_line()}; Qwen3 {args.shape} shape ({cfg['num_hidden_layers']} layers, {cfg['num_key_value_heads']} "
          f"KV heads of {cfg['head_dim']}), {args.weights} weights; budget {args.budget_gb:g} GB of peak RSS (weights, "
          "cache filled, one decode step of every row)")
    hdr = (f"{'cache':<32} | {'context':>7} | {'largest batch':>13} | {'batch x context':>15} | {'its peak':>8} | "
           f"{'first miss':>16} | {'GB / row':>8} | {'predicted':>9} | {'probes':>6} | note")
    print(hdr)
    print("-" * len(hdr))
    for label, context, r in rows:
        fit, miss = r["fit"], r["miss"]
        fit_s = f"{fit[0]:>13,}" if fit else f"{'none':>13}"
        bxc = f"{fit[0] * context:>15,}" if fit else f"{'-':>15}"
        peak = f"{fit[1] / 1e9:>5.2f} GB" if fit else f"{'-':>8}"
        miss_s = f"{miss[0]:,} ({'failed' if miss[1] is None else f'{miss[1] / 1e9:.1f} GB'})" if miss else "-"
        grow = f"{r['growth'] / 1e9:>8.3f}" if r["growth"] else f"{'-':>8}"
        pred = f"{r['predicted']:>9,}" if r["predicted"] else f"{'-':>9}"
        print(f"{label:<32} | {context:>7} | {fit_s} | {bxc} | {peak} | {miss_s:>16} | {grow} | {pred} | "
              f"{r['probes']:>6} | {r['note']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
