"""Small-scale VHA vs GQA study: same tokens, same hyper-parameters, several seeds, honest noise estimate.

Variants (a scaled-down Qwen3: hidden 128, 2 layers, head_dim 16, byte-level stdlib source):
    GQA-8            16 query heads, 8 KV heads          the paper's baseline shape, scaled
    GQA-2            16 query heads, 2 KV heads          same cache as VHA, all query heads
    GQA-2 half-q      8 query heads, 2 KV heads          VHA's physical shape without the maps
    VHA              16 virtual / 8 physical, 2 KV heads, Postmix rank 4
    VHA premix-only  VHA with Postmix frozen at the identity (U = V = 0, not trained)
    VHA postmix-only VHA with Premix frozen at the identity (every group sees the same queries)

    python tools/study.py                          # 3 seeds x 6 variants, about 25 minutes on 2 cores
    python tools/study.py --seeds 0 1 --steps 50   # a quick look

Writes OUT/study.json (every run's curve), OUT/study.png (validation loss, mean +- std over seeds) and prints a
table with mean +- std per variant and, against GQA-8 and GQA-2 half-q, whether each difference exceeds the
seed noise (|diff| > 2 x the standard error of the difference).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

from paddle_vha.cli import command, quiet

from .report import write_json
from .toy import toy_fields, check_toy_args

VARIANTS = {
    "GQA-8": dict(kind="gqa", heads=16, kv=8),
    "GQA-2": dict(kind="gqa", heads=16, kv=2),
    "GQA-2 half-q": dict(kind="gqa", heads=8, kv=2),
    "VHA": dict(kind="vha", heads=16, kv=2),
    "VHA premix-only": dict(kind="vha", heads=16, kv=2, freeze="postmix"),
    "VHA postmix-only": dict(kind="vha", heads=16, kv=2, freeze="premix"),
}


def build(name, args, seed):
    """The model for one variant and seed, with ablated maps frozen at the identity."""
    import paddle
    from paddleformers.transformers import Qwen3Config, Qwen3ForCausalLM

    from paddle_vha import Qwen3VHAConfig, Qwen3VHAForCausalLM

    v = VARIANTS[name]
    common = toy_fields(args.hidden, args.layers, args.head_dim, v["heads"], v["kv"], args.seq_len)
    paddle.seed(seed)
    if v["kind"] == "gqa":
        return Qwen3ForCausalLM(Qwen3Config(**common))
    model = Qwen3VHAForCausalLM(Qwen3VHAConfig(vha_postmix_rank=args.rank, **common))
    for layer in model.model.layers:
        attn = layer.self_attn
        if v.get("freeze") == "postmix":
            for p in (attn.vha_postmix_U, attn.vha_postmix_V):
                p.set_value(paddle.zeros_like(p))
                p.stop_gradient = True
        elif v.get("freeze") == "premix":
            w = attn.vha_premix_weight
            w.set_value(paddle.eye(w.shape[1], w.shape[2]).unsqueeze(0).expand(w.shape).astype(w.dtype))
            w.stop_gradient = True
    return model


def summarize(runs, names):
    import numpy as np

    stats = {}
    for n in names:
        vals = np.array([r["val_loss"] for r in runs if r["variant"] == n])
        stats[n] = dict(mean=float(vals.mean()), std=float(vals.std(ddof=1)) if len(vals) > 1 else float("nan"),
                        n=int(len(vals)), per_seed=vals.tolist())
    return stats


def verdict(a, b):
    """Difference a - b of means, its standard error, and whether it exceeds 2 standard errors."""
    import math

    diff = a["mean"] - b["mean"]
    se = math.sqrt(a["std"] ** 2 / a["n"] + b["std"] ** 2 / b["n"]) if a["n"] > 1 and b["n"] > 1 else float("nan")
    return diff, se, (abs(diff) > 2 * se) if se == se else None


def plot(runs, names, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for n in names:
        curves = [r["val_curve"] for r in runs if r["variant"] == n]
        steps = [s for s, _ in curves[0]]
        vals = np.array([[v for _, v in c] for c in curves])
        m, sd = vals.mean(0), vals.std(0)
        ax.plot(steps, m, label=n, lw=1.6)
        ax.fill_between(steps, m - sd, m + sd, alpha=0.15)
    ax.set_xlabel("step")
    ax.set_ylabel("validation loss (nats / byte)")
    ax.set_title(f"VHA vs GQA, mean ± std over {len({r['seed'] for r in runs})} seeds")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS), metavar="NAME")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--head-dim", type=int, default=16)
    p.add_argument("--rank", type=int, default=4, help="VHA Postmix rank")
    p.add_argument("--eval-every", type=int, default=50)
    p.add_argument("--val-batches", type=int, default=16)
    p.add_argument("--corpus-mb", type=float, default=8.0)
    p.add_argument("--out", default="docs/study", help="folder for study.json and study.png")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    if args.steps < 1 or args.batch_size < 1 or args.seq_len < 2:
        p.error("--steps, --batch-size must be >= 1 and --seq-len >= 2")
    check_toy_args(p, args)
    return args


def run_all(args, corpus, settings: dict) -> list:
    """Every requested variant for every seed, trained on the same batches; one dict per run."""
    from paddle_vha.train.loop import TrainSettings, train_lm

    runs = []
    for seed in args.seeds:
        for name in args.variants:
            model = build(name, args, seed)
            res = train_lm(model, corpus, TrainSettings(label=f"{name} seed {seed}", **settings))
            runs.append(dict(variant=name, seed=seed, val_loss=res.val_loss, final_train=res.last,
                             seconds=res.seconds, val_curve=res.val_curve,
                             params=int(sum(p.size for p in model.parameters()))))
            print(f"{name:<17} seed {seed}: val {res.val_loss:.4f}  ({res.seconds:.0f} s)", file=sys.stderr, flush=True)
    return runs


def print_table(args, runs, stats, t0: float) -> None:
    """Mean +- std per variant and, against GQA-8 and GQA-2 half-q, whether the difference exceeds the seed noise."""
    refs = [r for r in ("GQA-8", "GQA-2 half-q") if r in stats]
    print(f"\n{len(args.seeds)} seeds x {args.steps} steps, batch {args.batch_size} x {args.seq_len} bytes, "
          f"hidden {args.hidden}, {args.layers} layers, head_dim {args.head_dim}; {time.time() - t0:.0f} s")
    print(f"{'variant':<17} {'params':>8} {'val loss mean ± std':>22}   " + "".join(f"{'vs ' + r:<32}" for r in refs))
    for n in args.variants:
        s = stats[n]
        cols = []
        for r in refs:
            if r == n:
                cols.append(f"{'—':<32}")
                continue
            diff, se, sig = verdict(s, stats[r])
            word = "n/a" if sig is None else ("beyond noise" if sig else "within noise")
            cols.append(f"{diff:+.4f} ± {se:.4f} {word}".ljust(32))
        params = next(r["params"] for r in runs if r["variant"] == n)
        print(f"{n:<17} {params:>8,} {s['mean']:>12.4f} ± {s['std']:.4f}   " + "".join(cols))


@command
def main(argv=None):
    args = parse_args(argv)
    quiet()
    from paddle_vha.train.corpus import load_stdlib_corpus

    corpus = load_stdlib_corpus(max_bytes=int(args.corpus_mb * (1 << 20)))
    settings = dict(steps=args.steps, batch_size=args.batch_size, seq_len=args.seq_len, lr=args.lr, data_seed=1234,
                    val_batches=args.val_batches, eval_every=args.eval_every, progress=not args.no_progress)
    t0 = time.time()
    runs = run_all(args, corpus, settings)
    stats = summarize(runs, args.variants)

    os.makedirs(args.out, exist_ok=True)
    payload = dict(settings=dict(vars(args), **settings), runs=runs, stats=stats, wall_seconds=time.time() - t0)
    write_json(os.path.join(args.out, "study.json"), payload)
    plot(runs, args.variants, os.path.join(args.out, "study.png"))
    print_table(args, runs, stats, t0)
    print(f"\nwrote {os.path.join(args.out, 'study.json')} and {os.path.join(args.out, 'study.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
