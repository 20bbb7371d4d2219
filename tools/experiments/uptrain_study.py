"""Head-to-head at equal KV budget: ways from a trained GQA-8 Qwen3 to a 4x smaller KV cache, uptrained alike.

A GQA-8 base (16 query heads over 8 KV heads; a scaled-down Qwen3 on the embedded byte-level corpus) is trained once
with a cosine schedule that ends flat, and cached. Each start below has 2 KV heads (a quarter of the base's cache) and
is uptrained with the same tokens (per seed: the same batches, in the same order, for every start):
    GQA-2 mean-pool     stock Qwen3, each 4 KV heads averaged into one (the GQA paper's uptraining recipe)
    MEA                 tools/compress_kv.py --kv-heads 2 (SVD of the KV heads; HLC rebuilds 8 virtual ones)
    VHA mean|svd|calibrated   tools/convert_to_vha.py --kv-heads 2 --method ...
    VHA premix-off      tools/convert_to_vha.py --kv-heads 2 --premix off (the research fork's kv_postmix_only: the
                        16 query heads kept, no Premix, Postmix added; K/V merged as svd does)
  and, only when named in --starts (not in the default set):
    VHA refined         svd, then --refine-steps (--study-refine-steps) layer-wise refinement against the base
    VHA regrouped       svd with --regroup key-similarity (the keys' cosine similarity on calibration tokens)
and two references trained from scratch with the base's tokens (--reference-tokens total: plus the uptraining's), what
the small-cache model reaches without a base: GQA-2 scratch and VHA scratch.

Reports, per start and seed: validation loss and KL(base || model) before uptraining (step 0) and after it, and the
validation curve against uptraining tokens. Writes OUT/uptrain.json, OUT/uptrain.png and OUT/uptrain.md (the table and
a plain sentence: which start recovers most, with the seed spread).

    python tools/uptrain_study.py                                    # the default: about 40 minutes on 2 CPU cores
    python tools/uptrain_study.py --seeds 0 --base-steps 200 --uptrain-steps 40      # a quick look
    python tools/uptrain_study.py --hidden 512 --layers 8 --head-dim 64 --base-steps 20000 --uptrain-steps 2000 \\
        --batch-size 32 --seq-len 512                                # scaled up (a GPU: the model runs on Paddle's device)

The base is cached under --cache (keyed by everything that shapes it); --retrain-base ignores the cache.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import shutil
import sys
import tempfile
import time

from paddle_vha.cli import command, fail, quiet

from .report import write_atomic, write_json
from .toy import toy_fields, check_toy_args

PREMIX_OFF = "VHA premix-off"
STARTS = ["GQA-2 mean-pool", "MEA", "VHA mean", "VHA svd", "VHA calibrated", PREMIX_OFF]
EXTRA_STARTS = ["VHA refined", "VHA regrouped"]  # selectable with --starts, not in the default set
REFERENCES = ["GQA-2 scratch", "VHA scratch"]
HEADS, BASE_KV, KV = 16, 8, 2


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--base-steps", type=int, default=1000, help="GQA-8 base training steps (default 1000)")
    p.add_argument("--uptrain-steps", type=int, default=200, help="uptraining steps per start (default 200)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--lr", type=float, default=3e-3, help="peak LR of the base and the scratch references")
    p.add_argument("--uptrain-lr", type=float, default=1e-3, help="peak LR of uptraining (default 1e-3)")
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--head-dim", type=int, default=16)
    p.add_argument("--rank", type=int, default=4, help="VHA Postmix rank")
    p.add_argument("--calib-tokens", type=int, default=8192, help="calibration tokens of the calibrated conversion")
    p.add_argument("--val-batches", type=int, default=16)
    p.add_argument("--evals", type=int, default=5, help="validation points per uptraining run (default 5)")
    p.add_argument("--corpus-mb", type=float, default=8.0)
    p.add_argument("--starts", nargs="+", default=STARTS + REFERENCES, choices=STARTS + EXTRA_STARTS + REFERENCES,
                   metavar="NAME", help="subset of: " + ", ".join(STARTS + EXTRA_STARTS + REFERENCES))
    p.add_argument("--study-refine-steps", type=int, default=100, help="refinement steps per layer (VHA refined)")
    p.add_argument("--study-refine-tokens", type=int, default=4096, help="refinement tokens (VHA refined)")
    p.add_argument("--reference-tokens", choices=["base", "total"], default="base",
                   help="tokens of the from-scratch references: the base's (default) or the base's plus the uptraining's")
    p.add_argument("--cache", default=os.path.join("runs", "uptrain_study"), help="where the base is cached")
    p.add_argument("--retrain-base", action="store_true")
    p.add_argument("--out", default="docs/study", help="folder for uptrain.json, uptrain.png, uptrain.md")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    if min(args.base_steps, args.uptrain_steps, args.batch_size, args.evals, args.val_batches) < 1 or args.seq_len < 2:
        p.error("steps, --batch-size, --evals, --val-batches must be >= 1 and --seq-len >= 2")
    if args.hidden < 8 or args.head_dim < 2 or args.head_dim % 2:
        p.error("--hidden must be >= 8 and --head-dim even")
    check_toy_args(p, args)
    if args.calib_tokens < 1:
        p.error(f"--calib-tokens {args.calib_tokens}: must be >= 1")
    from paddle_vha.machine import available_memory_bytes
    from paddle_vha.transform.memory import text_window_bytes

    need, have = text_window_bytes(args.calib_tokens, args.seq_len), available_memory_bytes()
    if have is not None and need > have:  # refused now, not after training the base for minutes
        p.error(f"--calib-tokens {args.calib_tokens}: its calibration windows need {need / 2**30:.1f} GiB, this "
                f"machine has {have / 2**30:.1f} GiB available")
    return args


def qwen3_fields(args, kv: int) -> dict:
    """The toy Qwen3 of this study with `kv` KV heads (the base's cache key hashes these fields)."""
    return toy_fields(args.hidden, args.layers, args.head_dim, HEADS, kv, args.seq_len)


def settings(args, steps, lr, data_seed, label):
    from paddle_vha.train.loop import TrainSettings

    return TrainSettings(steps=steps, batch_size=args.batch_size, seq_len=args.seq_len, lr=lr, warmup=max(1, steps // 20),
                         data_seed=data_seed, val_batches=args.val_batches, eval_every=max(1, steps // args.evals),
                         progress=not args.no_progress, label=label)


def base_key(args) -> str:
    fields = dict(qwen3_fields(args, BASE_KV), steps=args.base_steps, batch=args.batch_size, seq=args.seq_len,
                  lr=args.lr, corpus_mb=args.corpus_mb, loop=1)
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:12]


def trained_base(args, corpus):
    """(base folder, info): the GQA-8 base, trained once per configuration and cached."""
    import paddle
    from paddleformers.transformers import Qwen3Config, Qwen3ForCausalLM

    from paddle_vha.train.loop import train_lm

    folder = os.path.join(args.cache, f"base-gqa8-{base_key(args)}")
    info_path = os.path.join(folder, "base_info.json")
    if os.path.isfile(info_path) and not args.retrain_base:
        with open(info_path) as f:
            info = json.load(f)
        print(f"base: cached {folder} (val loss {info['val_loss']:.4f})", file=sys.stderr)
        return folder, info
    paddle.seed(1234)
    model = Qwen3ForCausalLM(Qwen3Config(**qwen3_fields(args, BASE_KV)))
    s = settings(args, args.base_steps, args.lr, 1234, "GQA-8 base")
    s.eval_every = max(1, args.base_steps // 10)
    res = train_lm(model, corpus, s)
    curve = res.val_curve
    last_quarter = [v for st, v in curve if st >= 0.75 * args.base_steps]
    flat = (last_quarter[0] - last_quarter[-1]) / last_quarter[0] if len(last_quarter) > 1 else float("nan")
    info = dict(val_loss=res.val_loss, curve=curve, seconds=res.seconds, steps=args.base_steps,
                tokens=args.base_steps * args.batch_size * args.seq_len, last_quarter_relative_drop=flat)
    tmp = folder + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    with open(os.path.join(tmp, "base_info.json"), "w") as f:
        json.dump(info, f, indent=1)
    shutil.rmtree(folder, ignore_errors=True)
    os.replace(tmp, folder)
    print(f"base: trained {args.base_steps} steps in {res.seconds:.0f} s, val loss {res.val_loss:.4f} "
          f"(fell {flat:.1%} over the last quarter)", file=sys.stderr)
    return folder, info


def load(cls, folder):
    model = cls.from_pretrained(folder, dtype="float32")
    model.eval()
    return model


KV_PROJ = ("self_attn.k_proj.weight", "self_attn.v_proj.weight")  # what vha/convert.py's pool_kv_heads_state pools


def mean_pooled(args, base_dir):
    """GQA-2 mean-pool: the base with each BASE_KV / KV of its KV heads averaged into one (the GQA paper's start)."""
    import numpy as np
    import paddle
    from paddleformers.transformers import Qwen3Config, Qwen3ForCausalLM

    from paddle_vha.transform.convert_to_vha import pool_kv_heads_state

    state = {k: v.numpy() for k, v in load(Qwen3ForCausalLM, base_dir).state_dict().items()}
    on_disk = {k: a.T for k, a in state.items() if k.endswith(KV_PROJ)}  # Paddle [h, H_kv*d] -> on-disk [H_kv*d, h]
    pooled = pool_kv_heads_state(on_disk, BASE_KV, KV, args.head_dim)  # [KV*d, h]
    state.update({k: a.T.astype(state[k].dtype) for k, a in pooled.items()})  # back to Paddle's [h, KV*d]
    model = Qwen3ForCausalLM(Qwen3Config(**qwen3_fields(args, KV)))
    model.set_state_dict({k: paddle.to_tensor(np.ascontiguousarray(a)) for k, a in state.items()})
    return model


def refined_or_regrouped(name, args, base_dir, seed, out, moments):
    """VHA svd refined layer by layer against the base, or VHA svd with key-similarity regrouping."""
    from paddle_vha import Qwen3VHAForCausalLM
    from paddle_vha.transform import convert_to_vha as cv
    from paddle_vha.transform.refine import RefineSettings, refine_and_write
    from paddle_vha.transform.text import load_text

    regroup = "key-similarity" if name == "VHA regrouped" else "contiguous"
    plan = cv.plan_convert(base_dir, out, KV, postmix_rank=args.rank, method="svd", seed=seed, regroup=regroup)
    tensors = cv.LayerTensors(plan, "svd", moments)
    if name == "VHA regrouped":
        cv.convert_checkpoint(plan, tensors, progress=False)
        print(f"{name} seed {seed}: groups {plan.groups}", file=sys.stderr, flush=True)
    else:
        text = load_text(base_dir, plan.src_cfg.vocab_size, None, cv.ConvertError)
        reports = refine_and_write(plan, tensors, text, RefineSettings(args.study_refine_steps, seed=seed),
                                   args.study_refine_tokens, args.seq_len, progress=False, log=None)
        print(f"{name} seed {seed}: per-layer held-out rel MSE " + ", ".join(
            f"{r.before:.3f} -> {r.after:.3f}" for r in reports), file=sys.stderr, flush=True)
    return load(Qwen3VHAForCausalLM, out)


def start_model(name, args, base_dir, seed, scratch_dir, moments):
    """The model a start begins uptraining from (or a fresh reference)."""
    import paddle
    from paddleformers.transformers import Qwen3Config, Qwen3ForCausalLM

    from paddle_vha import Qwen3VHAConfig, Qwen3VHAForCausalLM
    from paddle_vha.transform import compress_kv as mea
    from paddle_vha.mea.modeling import Qwen3MEAForCausalLM
    from paddle_vha.transform import convert_to_vha as cv

    out = os.path.join(scratch_dir, f"{name.replace(' ', '_')}-{seed}")
    if name == "GQA-2 mean-pool":
        return mean_pooled(args, base_dir)
    if name == "MEA":
        plan = mea.plan_compress(base_dir, out, KV)
        mea.compress_checkpoint(plan, progress=False)
        return load(Qwen3MEAForCausalLM, out)
    if name in EXTRA_STARTS:
        return refined_or_regrouped(name, args, base_dir, seed, out, moments)
    if name.startswith("VHA ") and not name.endswith("scratch"):
        method, premix = ("svd", "off") if name == PREMIX_OFF else (name.split()[1], "on")
        plan = cv.plan_convert(base_dir, out, KV, postmix_rank=args.rank, method=method, seed=seed, premix=premix)
        cv.convert_checkpoint(plan, cv.convert_state(plan, method, moments), progress=False)
        return load(Qwen3VHAForCausalLM, out)
    paddle.seed(seed)
    if name == "GQA-2 scratch":
        return Qwen3ForCausalLM(Qwen3Config(**qwen3_fields(args, KV)))
    return Qwen3VHAForCausalLM(Qwen3VHAConfig(vha_postmix_rank=args.rank, **qwen3_fields(args, KV)))


def loss_and_kl(model, windows, base_logits):
    """Validation loss (nats/byte) and mean KL(base || model) per position on the fixed validation windows."""
    import numpy as np
    import paddle

    from paddle_vha.evaluate import log_softmax

    model.eval()
    losses, kls = [], []
    with paddle.no_grad():
        for (x, y), ref in zip(windows, base_logits):
            lp = log_softmax(model(paddle.to_tensor(x), return_dict=True).logits.astype("float64").numpy())
            losses.append(-np.take_along_axis(lp, y[..., None], axis=-1).mean())
            lr = log_softmax(ref)
            kls.append((np.exp(lr) * (lr - lp)).sum(-1).mean())
    return float(np.mean(losses)), float(np.mean(kls))


def mean_std(xs):
    import numpy as np

    xs = np.asarray(xs, float)
    return float(xs.mean()), (float(xs.std(ddof=1)) if len(xs) > 1 else float("nan"))


def summarize(runs, names):
    out = {}
    for n in names:
        rs = [r for r in runs if r["start"] == n]
        if not rs:
            continue
        out[n] = {k: mean_std([r[k] for r in rs]) for k in ("val0", "kl0", "val", "kl")}
        out[n]["per_seed_val"] = [r["val"] for r in rs]
    return out


def sentence(stats, base_val, seeds):
    starts = [n for n in STARTS + EXTRA_STARTS if n in stats]
    if not starts:
        return ""
    ranked = sorted(starts, key=lambda n: stats[n]["val"][0])
    best = ranked[0]
    m, sd = stats[best]["val"]
    text = (f"After equal uptraining, {best} recovers most: validation loss {m:.4f} ± {sd:.4f} (std over {len(seeds)} "
            f"seeds) against the GQA-8 base's {base_val:.4f}")
    if len(ranked) > 1:
        m2, sd2 = stats[ranked[1]]["val"]
        se = math.sqrt((sd ** 2 + sd2 ** 2) / len(seeds)) if len(seeds) > 1 else float("nan")
        gap = m2 - m
        beyond = se == se and gap > 2 * se
        text += (f"; the runner-up, {ranked[1]}, is {gap:.4f} behind ({'beyond' if beyond else 'within'} twice the "
                 f"standard error of the difference, {se:.4f})")
    worst = ranked[-1]
    text += f"; {worst} recovers least ({stats[worst]['val'][0]:.4f} ± {stats[worst]['val'][1]:.4f})."
    refs = [n for n in REFERENCES if n in stats]
    if refs:
        text += " Trained from scratch with the same total tokens: " + ", ".join(
            f"{n} {stats[n]['val'][0]:.4f} ± {stats[n]['val'][1]:.4f}" for n in refs) + "."
    return text


def table(stats, names) -> str:
    rows = ["| start | val loss step 0 | KL step 0 | val loss after | KL after |",
            "| --- | ---: | ---: | ---: | ---: |"]
    for n in names:
        if n not in stats:
            continue
        s = stats[n]
        f = lambda k, p=4: f"{s[k][0]:.{p}f} ± {s[k][1]:.{p}f}"  # noqa: E731
        if n in REFERENCES:
            rows.append(f"| {n} (from scratch) | — | — | {f('val')} | {f('kl')} |")
        else:
            rows.append(f"| {n} | {f('val0')} | {f('kl0')} | {f('val')} | {f('kl')} |")
    return "\n".join(rows)


def plot(runs, names, base_val, tokens_per_step, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for n in names:
        rs = [r for r in runs if r["start"] == n]
        if not rs or n in REFERENCES:
            continue
        steps = [0] + [s for s, _ in rs[0]["curve"]]
        vals = np.array([[r["val0"]] + [v for _, v in r["curve"]] for r in rs])
        m, sd = vals.mean(0), vals.std(0)
        x = np.array(steps) * tokens_per_step
        ax.plot(x, m, label=n, lw=1.6, marker="o", ms=3)
        ax.fill_between(x, m - sd, m + sd, alpha=0.15)
    ax.axhline(base_val, color="k", ls="--", lw=1, label="GQA-8 base")
    for n, ls in zip(REFERENCES, (":", "-.")):
        rs = [r["val"] for r in runs if r["start"] == n]
        if rs:
            ax.axhline(float(np.mean(rs)), color="gray", ls=ls, lw=1, label=f"{n} (from scratch)")
    ax.set_yscale("log")
    ax.set_xlabel("uptraining tokens (bytes)")
    ax.set_ylabel("validation loss (nats / byte, log scale)")
    ax.set_title(f"GQA-8 -> 2 KV heads, uptrained alike; mean ± std over {len({r['seed'] for r in runs})} seeds")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)



def base_reference(base_dir, windows):
    """The base's float64 logits on the validation windows (what KL is measured against) and its validation loss."""
    import paddle
    from paddleformers.transformers import Qwen3ForCausalLM

    base = load(Qwen3ForCausalLM, base_dir)
    with paddle.no_grad():
        base_logits = [base(paddle.to_tensor(x), return_dict=True).logits.astype("float64").numpy() for x, _ in windows]
    base_val, _ = loss_and_kl(base, windows, base_logits)
    return base_logits, base_val


def run_starts(args, corpus, base_dir, windows, base_logits, moments) -> list:
    """Every start (and reference) for every seed, uptrained alike in a scratch folder removed afterwards."""
    from paddle_vha.train.loop import train_lm

    runs = []
    scratch_dir = tempfile.mkdtemp(prefix="uptrain-study-")
    try:
        for seed in args.seeds:
            for name in args.starts:
                model = start_model(name, args, base_dir, seed, scratch_dir, moments)
                if name in REFERENCES:
                    steps = args.base_steps + (args.uptrain_steps if args.reference_tokens == "total" else 0)
                    lr, val0, kl0 = args.lr, float("nan"), float("nan")
                else:
                    steps, lr = args.uptrain_steps, args.uptrain_lr
                    val0, kl0 = loss_and_kl(model, windows, base_logits)
                res = train_lm(model, corpus, settings(args, steps, lr, 1000 + seed, f"{name} seed {seed}"))
                val, kl = loss_and_kl(model, windows, base_logits)
                runs.append(dict(start=name, seed=seed, val0=val0, kl0=kl0, val=val, kl=kl, curve=res.val_curve,
                                 steps=steps, lr=lr, seconds=res.seconds,
                                 params=int(sum(p.size for p in model.parameters()))))
                print(f"{name:<16} seed {seed}: val {val0:.4f} -> {val:.4f}, KL {kl0:.4f} -> {kl:.4f} "
                      f"({res.seconds:.0f} s)", file=sys.stderr, flush=True)
                del model
    finally:
        shutil.rmtree(scratch_dir, ignore_errors=True)
    return runs


def write_report(args, runs, base_dir, base_info, base_val, t0: float) -> None:
    """uptrain.json, uptrain.png and uptrain.md from the runs, and the same table and sentence on stdout."""
    tokens_per_step = args.batch_size * args.seq_len
    names = [n for n in STARTS + EXTRA_STARTS + REFERENCES if n in args.starts]
    stats = summarize(runs, names)
    said = sentence(stats, base_val, args.seeds)
    wall = time.time() - t0
    head = (f"{len(args.seeds)} seeds; base GQA-8 ({HEADS} query heads / {BASE_KV} KV heads, hidden {args.hidden}, "
            f"{args.layers} layers, head_dim {args.head_dim}) trained {args.base_steps} steps x {tokens_per_step} bytes "
            f"(val loss {base_val:.4f}; it fell {base_info['last_quarter_relative_drop']:.1%} over its last quarter); "
            f"starts with {KV} KV heads uptrained {args.uptrain_steps} steps x {tokens_per_step} bytes at peak LR "
            f"{args.uptrain_lr:g}; references from scratch "
            f"{args.base_steps + (args.uptrain_steps if args.reference_tokens == 'total' else 0)} steps at {args.lr:g}; "
            f"{wall:.0f} s")
    payload = dict(settings=vars(args), base=dict(base_info, val_loss_eval=base_val, folder=base_dir), runs=runs,
                   stats=stats, sentence=said, wall_seconds=wall, tokens_per_step=tokens_per_step)
    write_json(os.path.join(args.out, "uptrain.json"), payload)
    plot(runs, names, base_val, tokens_per_step, os.path.join(args.out, "uptrain.png"))
    md = (f"# Uptraining study: GQA-8 -> 2 KV heads (written by tools/uptrain_study.py)\n\n{head}.\n\n"
          f"{table(stats, names)}\n\nValidation loss in nats/byte on the fixed held-out windows; KL(base || model) "
          f"in nats per position; mean ± std over seeds.\n\n{said}\n\n![curves](uptrain.png)\n")
    write_atomic(os.path.join(args.out, "uptrain.md"), md)
    print("\n" + head + "\n\n" + table(stats, names) + "\n\n" + said)
    print(f"\nwrote {args.out}/uptrain.json, uptrain.png, uptrain.md")


@command
def main(argv=None):
    args = parse_args(argv)
    quiet()
    from paddle_vha.train.corpus import load_stdlib_corpus
    from paddle_vha.transform import convert_to_vha as cv

    t0 = time.time()
    try:
        os.makedirs(args.out, exist_ok=True)
        os.makedirs(args.cache, exist_ok=True)
    except OSError as e:
        fail(f"cannot create {args.out} or {args.cache}: {e.strerror or e}")
    corpus = load_stdlib_corpus(max_bytes=int(args.corpus_mb * (1 << 20)))
    base_dir, base_info = trained_base(args, corpus)
    windows = corpus.val_batches(args.batch_size, args.seq_len, args.val_batches)
    base_logits, base_val = base_reference(base_dir, windows)
    moments = None
    if "VHA calibrated" in args.starts or "VHA regrouped" in args.starts:
        moments = cv.calibration_moments(base_dir, args.calib_tokens, seq_len=args.seq_len)
    runs = run_starts(args, corpus, base_dir, windows, base_logits, moments)
    write_report(args, runs, base_dir, base_info, base_val, t0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
