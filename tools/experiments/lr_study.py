"""MEA's central claim, re-measured: learning-rate robustness, spikes, and the power-law pick of the rate.

Variants (a scaled-down Qwen3 on the embedded byte-level corpus; the same batches, in the same order, for every variant
and rate of a seed):
    Qwen3        the baseline: 8 query heads over 8 KV heads (MHA, the MEA paper's baseline)
    MEA          the same heads with HLC mixing K and V across heads (8 physical -> 8 virtual: no compression) and the
                 per-head GroupNorm before o_proj
    MEA no-norm  HLC without the GroupNorm (the paper's "modified Talking-Heads")
    VHA          8 virtual heads over 2 KV heads (4 physical query heads + Premix, Postmix rank 4)
Rates: the paper's grid 1e-4, 5e-4, 1e-3, 3e-3 plus 1e-2 above it; linear warm-up then a fixed rate (no decay).

Per run: the training-loss curve (spike detector below), the validation curve after warm-up and its power-law fit
L(t) = A t^-alpha + L_inf (t = training tokens; the paper's Appendix D; 0 <= L_inf <= min L, 0.1 <= alpha <= 2, fits
that end on a bound are counted), and how far the cross-head maps moved from their
initial values (HLC coefficients; Premix, Postmix). Then the two best variants at the best rate are run --long-factor
times longer to see whether the short runs' fitted L_inf ordering predicts the longer runs' ordering.

Spike: the training loss, smoothed over --smooth steps, rises above its running minimum by more than
max(--spike-rel x running minimum, --spike-abs) and does not come back within that margin's half for --recover steps
(or the run ends first). Diverged: a NaN or Inf loss, or a run that ends no better than predicting every byte uniformly
(ln 256: it unlearned everything); a diverged run counts as diverged, never as a number. A rate is stable for a variant
when no seed spiked or diverged.

    python tools/lr_study.py                                   # the default: about 40 minutes on 2 CPU cores
    python tools/lr_study.py --seeds 0 --steps 40 --rates 1e-3 1e-2 --long-factor 0     # a quick look
    python tools/lr_study.py --hidden 512 --layers 8 --head-dim 64 --steps 3000 --batch-size 32 --seq-len 512   # larger

Writes OUT/lr_study.json, OUT/lr_study.png and OUT/lr_study.md (tables and the verdict on the paper's statements).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

from paddle_vha.cli import command, fail, quiet

from .report import write_atomic, write_json
from .scaling import fit_power_law, spike_report
from .toy import toy_fields, check_toy_args

VARIANTS = ["Qwen3", "MEA", "MEA no-norm", "VHA"]
RATES = [1e-4, 5e-4, 1e-3, 3e-3, 1e-2]
HEADS = 8


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variants", nargs="+", default=VARIANTS, choices=VARIANTS, metavar="NAME")
    p.add_argument("--rates", type=float, nargs="+", default=RATES)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--steps", type=int, default=120, help="steps per run (default 120)")
    p.add_argument("--warmup", type=int, default=12, help="linear warm-up steps (default 12)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--head-dim", type=int, default=16)
    p.add_argument("--evals", type=int, default=8, help="validation points per run (default 8)")
    p.add_argument("--val-batches", type=int, default=4)
    p.add_argument("--smooth", type=int, default=5)
    p.add_argument("--spike-rel", type=float, default=0.10)
    p.add_argument("--spike-abs", type=float, default=0.2)
    p.add_argument("--recover", type=int, default=20)
    p.add_argument("--long-factor", type=int, default=2, help="length of the ordering check's runs (0 skips it)")
    p.add_argument("--corpus-mb", type=float, default=8.0)
    p.add_argument("--out", default="docs/study")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    if min(args.steps, args.batch_size, args.evals, args.val_batches, args.smooth, args.recover) < 1:
        p.error("--steps, --batch-size, --evals, --val-batches, --smooth, --recover must be >= 1")
    if args.evals < 3:
        p.error("--evals must be >= 3 (the power-law fit has 3 parameters)")
    if any(not (r > 0 and math.isfinite(r)) for r in args.rates):
        p.error("--rates must be positive numbers")
    check_toy_args(p, args)
    return args


def build(name, args, seed):
    import paddle
    from paddleformers.transformers import Qwen3Config, Qwen3ForCausalLM

    from paddle_vha import Qwen3VHAConfig, Qwen3VHAForCausalLM
    from paddle_vha.mea.config import Qwen3MEAConfig
    from paddle_vha.mea.modeling import Qwen3MEAForCausalLM

    fields = lambda kv: toy_fields(args.hidden, args.layers, args.head_dim, HEADS, kv, args.seq_len)  # noqa: E731
    paddle.seed(seed)
    if name == "Qwen3":
        return Qwen3ForCausalLM(Qwen3Config(**fields(HEADS)))
    if name.startswith("MEA"):
        return Qwen3MEAForCausalLM(Qwen3MEAConfig(mea_kv_heads=HEADS, mea_group_norm=name == "MEA", **fields(HEADS)))
    return Qwen3VHAForCausalLM(Qwen3VHAConfig(vha_postmix_rank=4, **fields(2)))


def map_state(model):
    """The cross-head maps whose movement the study reports, as float64 numpy, per layer."""
    out = {}
    for i, layer in enumerate(model.model.layers):
        a = layer.self_attn
        for n in ("mea_k_lc", "mea_v_lc", "vha_premix_weight"):
            if hasattr(a, n):
                out[f"{i}.{n}"] = getattr(a, n).numpy().astype("float64")
        if hasattr(a, "vha_postmix_U"):  # Postmix's mixing V U^T (the part that is not the identity)
            out[f"{i}.postmix_VUt"] = (a.vha_postmix_V.numpy().astype("float64") @
                                       a.vha_postmix_U.numpy().astype("float64").T)
    return out


def map_movement(before, after):
    """Per kind of map: mean over layers of ||after - before|| / ||before|| (Postmix: ||V U^T|| itself, since its start
    is ~0), and for HLC the off-diagonal share ||offdiag|| / ||diag|| after training (cross-head mixing in use)."""
    import numpy as np

    kinds = {}
    for key, b in before.items():
        kind = key.split(".", 1)[1]
        a = after[key]
        if kind == "postmix_VUt":
            kinds.setdefault("postmix |V U^T|", []).append(float(np.linalg.norm(a)))
            continue
        kinds.setdefault(kind + " rel change", []).append(float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30)))
        if kind.startswith("mea_"):
            for when, m in (("init", b), ("end", a)):
                off = m - np.diag(np.diag(m))
                kinds.setdefault(f"{kind} offdiag/diag {when}", []).append(
                    float(np.linalg.norm(off) / max(np.linalg.norm(np.diag(m)), 1e-30)))
    return {k: float(np.mean(v)) for k, v in kinds.items()}


def one_run(name, rate, seed, steps, args, corpus):
    from paddle_vha.train.loop import TrainSettings, train_lm

    model = build(name, args, seed)
    before = map_state(model)
    s = TrainSettings(steps=steps, batch_size=args.batch_size, seq_len=args.seq_len, lr=rate, warmup=args.warmup,
                      data_seed=1000 + seed, val_batches=args.val_batches, eval_every=max(1, steps // args.evals),
                      progress=not args.no_progress, label=f"{name} lr {rate:g} seed {seed}", schedule="constant")
    res = train_lm(model, corpus, s)
    spiked, diverged, at = spike_report(res.losses, args)
    tok = args.batch_size * args.seq_len
    curve = [(st, v) for st, v in res.val_curve if st > args.warmup]  # after warm-up: the fixed-rate regime
    fit = None if diverged else fit_power_law([st * tok for st, _ in curve], [v for _, v in curve])
    return dict(variant=name, rate=rate, seed=seed, steps=steps, losses=res.losses, val_curve=res.val_curve,
                val=None if diverged else res.val_loss, spiked=spiked, diverged=diverged, event_step=at, fit=fit,
                maps=map_movement(before, map_state(model)) if not diverged else {}, seconds=res.seconds)


def cell_stats(runs, variant, rate):
    import numpy as np

    rs = [r for r in runs if r["variant"] == variant and r["rate"] == rate and r["steps"] == runs[0]["steps"]]
    good = [r for r in rs if not r["diverged"]]
    linf = [r["fit"]["L_inf"] for r in good if r["fit"]]

    def ms(xs):
        xs = np.asarray(xs, float)
        return (float(xs.mean()), float(xs.std(ddof=1)) if len(xs) > 1 else float("nan")) if len(xs) else (None, None)

    return dict(n=len(rs), spiked=sum(r["spiked"] for r in rs), diverged=sum(r["diverged"] for r in rs),
                val=ms([r["val"] for r in good]), L_inf=ms(linf),
                fit_rms=ms([r["fit"]["rms"] for r in good if r["fit"]]),
                fits_at_bound=sum(1 for r in good if r["fit"] and r["fit"]["at_bound"]),
                maps={k: ms([r["maps"][k] for r in good if k in r["maps"]])[0]
                      for k in sorted({k for r in good for k in r["maps"]})})


def plot(stats, variants, rates, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for v in variants:
        xs, ys, es, bad = [], [], [], []
        for r in rates:
            c = stats[v][str(r)]
            if c["val"][0] is not None:
                xs.append(r)
                ys.append(c["val"][0])
                es.append(0.0 if c["val"][1] != c["val"][1] else c["val"][1])
            if c["spiked"] or c["diverged"]:
                bad.append((r, c["val"][0] if c["val"][0] is not None else None))
        line = ax.errorbar(xs, ys, yerr=es, marker="o", ms=4, capsize=3, label=v)
        for r, y in bad:
            ax.plot([r], [y if y is not None else max(ys or [0]) * 1.05], marker="x", ms=10, mew=2,
                    color=line[0].get_color())
    ax.set_xscale("log")
    ax.set_xlabel("peak learning rate (linear warm-up, then fixed)")
    ax.set_ylabel("final validation loss (nats / byte)")
    ax.set_title("final validation loss, mean ± std over seeds (x: a seed spiked or diverged)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)




def fmt(ms, p=4):
    m, s = ms
    if m is None:
        return "—"
    return f"{m:.{p}f}" + ("" if s != s else f" ± {s:.{p}f}")


def verdicts(stats, variants, rates, long_check):
    """Plain sentences on the paper's three statements, from the measured cells."""
    out = []

    def stable(v, r):
        c = stats[v][str(r)]
        return c["spiked"] == 0 and c["diverged"] == 0

    largest = {v: max([r for r in rates if stable(v, r)], default=None) for v in variants}
    if "MEA" in variants:
        others = [v for v in variants if v != "MEA"]
        beyond = [v for v in others if largest[v] is not None and largest["MEA"] is not None and largest[v] >= largest["MEA"]]
        if all(largest[v] == max(rates) for v in variants):
            claim = (f"cannot be tested at this scale — no variant spiked or diverged at any rate, up to {max(rates):g}, "
                     "so the grid does not separate them")
        else:
            claim = ("holds" if largest["MEA"] is not None and not beyond else "does not hold") + " here"
        out.append(f"(1) 'MEA stays stable at larger learning rates than the others': {claim}; largest rate with no "
                   "spike or divergence in any seed: " + ", ".join(f"{v} {largest[v]:g}" if largest[v] else f"{v} none"
                                                                      for v in variants) + ".")
        best_rate = {v: min((r for r in rates if stats[v][str(r)]["val"][0] is not None),
                            key=lambda r: stats[v][str(r)]["val"][0], default=None) for v in variants}
        at = best_rate["MEA"]
        if at is not None:
            lowest = min(variants, key=lambda v: min((stats[v][str(r)]["val"][0] for r in rates
                                                      if stats[v][str(r)]["val"][0] is not None), default=1e9))
            out.append(f"(2) 'MEA reaches the lowest loss at 1e-3': MEA's best rate here is {at:g} "
                       f"(val {fmt(stats['MEA'][str(at)]['val'])}); the lowest loss of any variant at any rate is "
                       f"{lowest}'s — {'holds' if at == 1e-3 and lowest == 'MEA' else 'does not hold'} at this scale.")
    if "MEA no-norm" in variants and "Qwen3" in variants:
        diffs = []
        for r in rates:
            a, b = stats["MEA no-norm"][str(r)]["val"], stats["Qwen3"][str(r)]["val"]
            if a[0] is not None and b[0] is not None:
                se = math.sqrt(((a[1] if a[1] == a[1] else 0) ** 2 + (b[1] if b[1] == b[1] else 0) ** 2) /
                               max(stats["Qwen3"][str(r)]["n"], 1))
                diffs.append((r, a[0] - b[0], se))
        near = [r for r, d, se in diffs if abs(d) <= 2 * se]
        out.append("(3) 'the variant without GroupNorm behaves nearly identically to the baseline': final-loss "
                   "differences MEA no-norm - Qwen3 " + ", ".join(f"{d:+.4f} ± {se:.4f} at {r:g}" for r, d, se in diffs)
                   + f"; within twice the standard error at {len(near)} of {len(diffs)} rates — "
                   + ("holds" if len(near) == len(diffs) else "holds only partly" if near else "does not hold") + ".")
    if long_check:
        out.append(long_check)
    return out


def ordering_pick(stats, args):
    """(best rate, the two variants with the lowest fitted L_inf there) for the longer-run check, or (None, [])."""
    def best_cell(v):
        cells = [(stats[v][str(r)]["val"][0], r) for r in args.rates if stats[v][str(r)]["val"][0] is not None]
        return min(cells) if cells else (float("inf"), None)

    best_rate = min(best_cell(v) for v in args.variants)[1]
    if best_rate is None:
        return None, []
    ranked = sorted((stats[v][str(best_rate)]["L_inf"][0], v) for v in args.variants
                    if stats[v][str(best_rate)]["L_inf"][0] is not None)[:2]
    return best_rate, ranked


def long_sentence(best_rate, ranked, long_runs, factor) -> str:
    import numpy as np

    if len(ranked) < 2 or not long_runs:
        return ""
    long_val = {}
    for _, v in ranked:
        vals = [r["val"] for r in long_runs if r["variant"] == v and r["val"] is not None]
        long_val[v] = float(np.mean(vals)) if vals else float("inf")
    predicted = [v for _, v in ranked]
    observed = sorted(long_val, key=long_val.get)
    return (f"(4) Short-run fit vs a {factor}x longer run at the best rate {best_rate:g}: the fitted L_inf ranks "
            f"{predicted[0]} ({ranked[0][0]:.4f}) ahead of {predicted[1]} ({ranked[1][0]:.4f}); the longer runs end at "
            f"{observed[0]} {long_val[observed[0]]:.4f}, {observed[1]} {long_val[observed[1]]:.4f} — the fit "
            f"{'predicted' if predicted == observed else 'did not predict'} the ordering (a weak test: two variants, and "
            "the short runs' L_inf are poorly determined, see the spread and the fits at a bound).")


def render(args, runs, long_runs, wall) -> str:
    """Tables, verdicts, PNG and JSON from the runs (also used by --render on a saved JSON)."""
    stats = {v: {str(r): cell_stats(runs, v, r) for r in args.rates} for v in args.variants}
    best_rate, ranked = ordering_pick(stats, args)
    said = verdicts(stats, args.variants, args.rates, long_sentence(best_rate, ranked, long_runs, args.long_factor))
    rows = ["| variant | rate | spiked / diverged seeds | final val loss | fitted L_inf | fit rms | fits at a bound |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for v in args.variants:
        for r in args.rates:
            c = stats[v][str(r)]
            rows.append(f"| {v} | {r:g} | {c['spiked']} / {c['diverged']} of {c['n']} | {fmt(c['val'])} | "
                        f"{fmt(c['L_inf'])} | {fmt(c['fit_rms'], 4)} | {c['fits_at_bound']} |")
    map_keys = sorted({k for v in args.variants for r in args.rates for k in stats[v][str(r)]["maps"]})
    mrows = ["| variant | rate | " + " | ".join(map_keys) + " |", "| --- | ---: |" + " ---: |" * len(map_keys)]
    for v in args.variants:
        for r in args.rates:
            m = stats[v][str(r)]["maps"]
            if m:
                mrows.append(f"| {v} | {r:g} | " + " | ".join(
                    "—" if m.get(k) is None else f"{m[k]:.3f}" for k in map_keys) + " |")
    order = []
    for r in args.rates:
        cells = sorted((stats[v][str(r)]["L_inf"][0], v) for v in args.variants if stats[v][str(r)]["L_inf"][0] is not None)
        order.append(f"- {r:g}: " + " < ".join(f"{v} {fmt(stats[v][str(r)]['L_inf'])}" for _, v in cells))
    head = (f"{len(args.seeds)} seeds x {len(args.rates)} rates x {len(args.variants)} variants, {args.steps} steps of "
            f"{args.batch_size} x {args.seq_len} bytes (warm-up {args.warmup}, then a fixed rate); hidden {args.hidden}, "
            f"{args.layers} layers, {HEADS} heads of {args.head_dim}; spike: smoothed over {args.smooth} steps, above the "
            f"running minimum by max({args.spike_rel:g} x it, {args.spike_abs:g}) and not back within half that for "
            f"{args.recover} steps; {wall:.0f} s")
    md = "\n\n".join([
        "# Learning-rate study (written by tools/lr_study.py)", head + ".",
        "\n".join(rows),
        "Variants ordered by fitted L_inf at each rate (mean ± std over non-diverged seeds):\n" + "\n".join(order),
        "How far the cross-head maps moved (mean over layers and seeds): relative change from the initial value; HLC's "
        "off-diagonal share ||offdiag|| / ||diag|| at initialisation and after training (cross-head mixing in use); "
        "Postmix's mixing ||V U^T|| after training (its start is 0):\n\n" + "\n".join(mrows),
        "\n".join(said), "![final loss vs rate](lr_study.png)"]) + "\n"
    payload = dict(settings=vars(args), runs=runs, long_runs=long_runs, stats=stats, verdicts=said, wall_seconds=wall)
    write_json(os.path.join(args.out, "lr_study.json"), payload)
    plot(stats, args.variants, args.rates, os.path.join(args.out, "lr_study.png"))
    write_atomic(os.path.join(args.out, "lr_study.md"), md)
    return md


@command
def main(argv=None):
    if argv is None:
        argv = sys.argv[1:]
    if argv[:1] == ["--render"]:  # re-render tables, verdicts and the plot from a saved lr_study.json (no training)
        if len(argv) != 2:
            fail("usage: tools/lr_study.py --render OUT/lr_study.json")
        import types

        try:
            with open(argv[1]) as f:
                saved = json.load(f)
            args = types.SimpleNamespace(**saved["settings"])
            args.out = os.path.dirname(os.path.abspath(argv[1]))
            print(render(args, saved["runs"], saved["long_runs"], saved["wall_seconds"]))
        except (OSError, ValueError, KeyError, TypeError) as e:
            fail(f"{argv[1]}: not a lr_study.json this version can render ({type(e).__name__}: {e})")
        return 0
    args = parse_args(argv)
    quiet()
    from paddle_vha.train.corpus import load_stdlib_corpus

    t0 = time.time()
    try:
        os.makedirs(args.out, exist_ok=True)
    except OSError as e:
        fail(f"cannot create {args.out}: {e.strerror or e}")
    corpus = load_stdlib_corpus(max_bytes=int(args.corpus_mb * (1 << 20)))
    runs = []
    for seed in args.seeds:
        for rate in args.rates:
            for name in args.variants:
                r = one_run(name, rate, seed, args.steps, args, corpus)
                runs.append(r)
                state = "diverged" if r["diverged"] else ("spiked" if r["spiked"] else "ok")
                linf = f", L_inf {r['fit']['L_inf']:.3f}" if r["fit"] else ""
                print(f"{name:<12} lr {rate:<7g} seed {seed}: {state:<8} val "
                      f"{'nan' if r['val'] is None else format(r['val'], '.4f')}{linf} ({r['seconds']:.0f} s)",
                      file=sys.stderr, flush=True)
    # Does the short runs' fit predict the longer runs' ordering? Top two variants by fitted L_inf at the best rate.
    long_runs = []
    if args.long_factor > 0 and len(args.variants) >= 2:
        stats = {v: {str(r): cell_stats(runs, v, r) for r in args.rates} for v in args.variants}
        best_rate, ranked = ordering_pick(stats, args)
        if len(ranked) == 2:
            for seed in args.seeds:
                for _, v in ranked:
                    r = one_run(v, best_rate, seed, args.steps * args.long_factor, args, corpus)
                    long_runs.append(r)
                    print(f"long {v:<12} lr {best_rate:g} seed {seed}: val {r['val']}", file=sys.stderr, flush=True)
    md = render(args, runs, long_runs, time.time() - t0)
    print("\n" + md)
    print(f"wrote {args.out}/lr_study.json, lr_study.png, lr_study.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
