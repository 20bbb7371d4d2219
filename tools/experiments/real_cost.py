"""What each start of the real-model study costs to serve: KV bytes per token and the decode speed of its int4 export
next to the original's (tools/real_model_study.py --phases cost).

Each start's servable form (a VHA start folded first by tools/fold.py's library: premix-off folds to a stock model
with one KV head, the MQA start's shape) is exported by tools/export_onnx.py's library in the buffer flavour with
--weights int4 (MatMulNBits, block 32). The export's own quality gate (paddle_vha/export/quality.py: int4 vs the
float32 export on its held-out text, mean KL <= 0.25 and decisive-position agreement >= 80%) is measured and recorded,
not enforced, so a start whose int4 export fails it is still timed: the table says which pass. The weights measured
are the step-0 start's (decode speed depends on the graph's shapes, not the weights' values).

Timing: tools/bench_serve_cpu.py's own snippets in a fresh process each: batch 1 (a 128-token prompt, then
--bench-new greedy steps) and batch 8 at a 4,096-token context (every row's cache filled with random keys and values,
then 8 decode steps). Forms with the same graph shape (the MQA start and every folded VHA start: a stock model with
one KV head) are timed once and the row says so.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import sys
import time

from .real_plan import CHEAP, ORIGINAL, kv_bytes_per_token

__all__ = ["cost_rows"]

THREADS = len(os.sched_getaffinity(0))


def _servable(args, name, folder, log) -> str:
    """The folder an export reads: the start itself, or its fold for a VHA start."""
    from paddle_vha.families import family_of

    if family_of(folder).variant != "vha":
        return folder
    from paddle_vha.transform.fold import fold_checkpoint, plan_fold

    out = os.path.join(args.cache, "cost", f"{name.replace(' ', '_')}-fold")
    if not os.path.isfile(os.path.join(out, "config.json")):
        shutil.rmtree(out, ignore_errors=True)
        fold_checkpoint(plan_fold(folder, out), progress=False)
        log(f"cost: folded {name} -> {out}")
    return out


def _form(folder) -> str:
    with open(os.path.join(folder, "config.json")) as f:
        c = json.load(f)
    kind = "MEA" if "mea_kv_heads" in c else "stock"
    return f"{kind}, {c['num_attention_heads']} query / {c['num_key_value_heads']} KV heads"


def _export(args, name, servable, log) -> tuple:
    from paddle_vha.export.onnx_export import export_onnx
    from paddle_vha.export.quality import BOUNDS

    from paddle_vha.export.errors import ExportError

    out = os.path.join(args.cache, "cost", f"{name.replace(' ', '_')}-int4")
    if not os.path.isfile(os.path.join(out, "export_info.json")):
        t = time.time()
        try:
            export_onnx(servable, out, weights="int4", cache_io="buffer", force=True, decode_steps=2,
                        quality_bounds=(math.inf, 0.0), log=lambda m: None)
        except ExportError as e:  # the float32 self-validation of a badly converted start (huge activations) can
            # exceed 1e-4 x max |logit|; its speed is still the row's point: exported again at 1e-3, said in the log
            if "validation failed" not in str(e):
                raise
            log(f"cost: {name}: {e}; exported again with --tolerance 1e-3")
            export_onnx(servable, out, weights="int4", cache_io="buffer", force=True, decode_steps=2,
                        quality_bounds=(math.inf, 0.0), log=lambda m: None, tolerance=1e-3)
        log(f"cost: exported {name} (int4, buffer flavour) in {time.time() - t:.0f} s")
    with open(os.path.join(out, "export_info.json")) as f:
        q = json.load(f)["weights"]["quality"]
    kl_max, agree_min = BOUNDS["int4"]
    ok = q["mean_kl"] <= kl_max and q["agreement"] >= agree_min
    gate = (f"{'passes' if ok else 'FAILS'}: KL {q['mean_kl']:.3f} (<= {kl_max:g}), agreement "
            f"{100 * q['agreement']:.0f}% (>= {100 * agree_min:g}%)")
    return out, gate, q


def _time(export, args, log) -> dict:
    import bench_serve_cpu as b  # tools/ is the runner's folder, first on the path

    out = {}
    r1 = b.run_json(sys.executable, b.OURS, [export, 1, 128, args.bench_new, THREADS], log=log)
    r8 = b.run_json(sys.executable, b.OURS_BATCH, [export, 8, 4096, 8, THREADS, "random"], log=log)
    if r1:
        out["b1"] = 1.0 / r1["step"]
    if r8:
        out["b8"] = 8.0 / r8["step"]
    return out


def cost_rows(args, journal, starts, log) -> list:
    """One journal record per start (and the original): its form, KV bytes, int4 gate and decode speed. The exports
    and folds are removed once measured (the disk is shared)."""

    rows, timed = [], {}
    for name in [ORIGINAL] + args.starts:
        key = dict(kind="cost", start=name, bench_new=args.bench_new, kv=args.kv_heads)
        rec = journal.find(key)
        if rec is None:
            folder = starts.folder(name)
            servable = _servable(args, name, folder, log)
            form = _form(servable)
            export, gate, quality = _export(args, name, servable, log)
            if form in timed:
                speed = dict(timed[form][1], note=f"same graph shape as {timed[form][0]}: timed once")
            else:
                log(f"cost: timing {name} ({form})")
                speed = _time(export, args, log)
                speed["load_average"] = os.getloadavg()[0]
            rec = journal.add(key, dict(form=form, kv_fp32=2 * kv_bytes_per_token(servable), gate=gate,
                                        quality=quality, **speed))
            shutil.rmtree(export, ignore_errors=True)
            if servable != folder:
                shutil.rmtree(servable, ignore_errors=True)
            if name in CHEAP:
                shutil.rmtree(folder, ignore_errors=True)
        timed.setdefault(rec["form"], (name, {k: rec[k] for k in ("b1", "b8") if k in rec}))
        log(f"cost {name}: {rec['form']}; int4 gate {rec['gate']}; batch 1 {rec.get('b1', float('nan')):.1f} "
            f"tokens/s, batch 8 @ 4K {rec.get('b8', float('nan')):.1f} tokens/s")
        rows.append(rec)
    return rows
