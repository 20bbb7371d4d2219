"""Head-to-head at equal KV budget: ways from a trained GQA-8 Qwen3 to a 4x smaller KV cache, uptrained alike.

A GQA-8 base (16 query heads over 8 KV heads; a scaled-down Qwen3 on the embedded byte-level corpus) is trained once
with a cosine schedule that ends flat, and cached. Each start below has 2 KV heads (a quarter of the base's cache) and
is uptrained with the same tokens (per seed: the same batches, in the same order, for every start and loss):
    GQA-2 mean-pool     stock Qwen3, each 4 KV heads averaged into one (the GQA paper's uptraining recipe)
    MEA                 tools/compress_kv.py --kv-heads 2 (SVD of the KV heads; HLC rebuilds 8 virtual ones)
    VHA svd|calibrated  tools/convert_to_vha.py --kv-heads 2 --method ...
    VHA refined         svd, then --refine-steps (--study-refine-steps) layer-wise refinement against the base
    VHA regrouped       svd with --regroup key-similarity (the keys' cosine similarity on calibration tokens)
    VHA premix-off      tools/convert_to_vha.py --kv-heads 2 --premix off (the research fork's kv_postmix_only: the
                        16 query heads kept, no Premix, Postmix added; K/V merged as svd does)
  (VHA mean, the plain average, only when named in --starts), each with each of --losses:
    ce                  next-byte cross-entropy
    kd                  the distillation mix of tools/train.py --teacher (paddle_vha/train/distiller.py, the same
                        code) against the frozen base: --kd-ce CE + --kd-kl T^2 KL + --kd-hidden / --kd-attn MSE
and two references trained from scratch with cross-entropy and the base's tokens (--reference-tokens total: plus the
uptraining's), what the small-cache model reaches without a base: GQA-2 scratch and VHA scratch.

Reports, per arm (start x loss) and seed: validation loss and KL(base || model) before uptraining (step 0) and after
it; the curve of validation loss against uptraining tokens (converted starts) and training tokens (from scratch);
and the crossover, the tokens each arm needs to come within 2% of the base's validation loss (tools/experiments/
uptrain_report.py). Writes OUT/uptrain.json, OUT/uptrain.png and OUT/uptrain.md.

    python tools/uptrain_study.py                     # the default (hidden 128, 1000 + 7 x 2 x 200 steps per seed): hours
    python tools/uptrain_study.py --hidden 64 --batch-size 8 --base-steps 200 --uptrain-steps 30 --evals 6 \\
        --scratch-evals 10 --val-batches 6 --study-refine-steps 60 --study-refine-tokens 2048 --calib-tokens 4096
                                                      # docs/study/uptrain.md: ~16 min of CPU, 511 MB peak RSS
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
STARTS = ["GQA-2 mean-pool", "MEA", "VHA svd", "VHA calibrated", "VHA refined", "VHA regrouped", PREMIX_OFF]
EXTRA_STARTS = ["VHA mean"]  # selectable with --starts, not in the default set
REFINED_OR_REGROUPED = ("VHA refined", "VHA regrouped")
LOSSES = ["ce", "kd"]
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
    p.add_argument("--scratch-evals", type=int, default=10, help="validation points per from-scratch run (default 10)")
    p.add_argument("--losses", nargs="+", default=LOSSES, choices=LOSSES,
                   help="uptraining losses: ce (cross-entropy) and kd (the distillation mix against the base)")
    p.add_argument("--kd-ce", type=float, default=1.0, help="KD: weight of the cross-entropy (default 1)")
    p.add_argument("--kd-kl", type=float, default=1.0, help="KD: weight of T^2 KL(base || student) (default 1)")
    p.add_argument("--kd-temperature", type=float, default=1.0, help="KD: temperature T (default 1)")
    p.add_argument("--kd-hidden", type=float, default=0.0, help="KD: weight of the decoder-layer output MSE")
    p.add_argument("--kd-attn", type=float, default=0.0, help="KD: weight of the attention-output MSE")
    p.add_argument("--kd-schedule", choices=["constant", "linear"], default="constant", help="KD weights over steps")
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
    p.add_argument("--resume", action="store_true",
                   help="reuse the runs an interrupted study with the same settings logged under --cache")
    args = p.parse_args(argv)
    if min(args.base_steps, args.uptrain_steps, args.batch_size, args.evals, args.scratch_evals,
           args.val_batches) < 1 or args.seq_len < 2:
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
    if name in REFINED_OR_REGROUPED:
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


def base_reference(base_dir, windows):
    """The base's float64 logits on the validation windows (what KL is measured against) and its validation loss."""
    import paddle
    from paddleformers.transformers import Qwen3ForCausalLM

    base = load(Qwen3ForCausalLM, base_dir)
    with paddle.no_grad():
        base_logits = [base(paddle.to_tensor(x), return_dict=True).logits.astype("float64").numpy() for x, _ in windows]
    base_val, _ = loss_and_kl(base, windows, base_logits)
    return base_logits, base_val


def uptrain_one(args, name, loss, seed, model, corpus, teacher, windows, base_logits) -> dict:
    """One arm for one seed: uptrain (or train from scratch) `model` and measure it before and after."""
    from paddle_vha.train.distiller import Distiller
    from paddle_vha.train.loop import train_lm

    reference = name in REFERENCES
    if reference:
        steps = args.base_steps + (args.uptrain_steps if args.reference_tokens == "total" else 0)
        lr, val0, kl0, evals = args.lr, float("nan"), float("nan"), args.scratch_evals
    else:
        steps, lr, evals = args.uptrain_steps, args.uptrain_lr, args.evals
        val0, kl0 = loss_and_kl(model, windows, base_logits)
    s = settings(args, steps, lr, 1000 + seed, f"{name} {loss} seed {seed}")
    s.eval_every = max(1, steps // evals)
    distiller = Distiller(model, teacher, kd_settings(args)) if loss == "kd" else None
    try:
        res = train_lm(model, corpus, s, distiller=distiller)
    finally:
        if distiller is not None:
            distiller.close()
    val, kl = loss_and_kl(model, windows, base_logits)
    print(f"{name:<16} {loss} seed {seed}: val {val0:.4f} -> {val:.4f}, KL {kl0:.4f} -> {kl:.4f} "
          f"({res.seconds:.0f} s)", file=sys.stderr, flush=True)
    return dict(start=name, loss=loss, reference=reference, seed=seed, val0=val0, kl0=kl0, val=val, kl=kl,
                curve=res.val_curve, steps=steps, lr=lr, seconds=res.seconds,
                params=int(sum(p.size for p in model.parameters())))


def kd_settings(args):
    from paddle_vha.train.distill import DistillSettings

    d = DistillSettings(ce_weight=args.kd_ce, kl_weight=args.kd_kl, temperature=args.kd_temperature,
                        hidden_weight=args.kd_hidden, attn_weight=args.kd_attn, schedule=args.kd_schedule)
    d.check()
    return d


def run_starts(args, corpus, base_dir, windows, base_logits, moments) -> list:
    """Every start (and reference) for every seed and loss, uptrained alike in a scratch folder removed afterwards.
    A start is converted once per seed; its KD arm starts from a fresh copy of the same converted weights."""
    import copy

    from paddleformers.transformers import Qwen3ForCausalLM

    from paddle_vha.train.teacher import freeze

    teacher = freeze(load(Qwen3ForCausalLM, base_dir)) if "kd" in args.losses else None
    log_path = runs_log(args)
    done = {}
    if args.resume and os.path.isfile(log_path):
        with open(log_path) as f:
            done = {(r["start"], r["loss"], r["seed"]): r for r in map(json.loads, f)}
        print(f"resume: {len(done)} runs logged in {log_path}", file=sys.stderr)
    runs = []
    scratch_dir = tempfile.mkdtemp(prefix="uptrain-study-")
    try:
        for seed in args.seeds:
            for name in args.starts:
                losses = ["ce"] if name in REFERENCES else args.losses
                todo = [l for l in losses if (name, l, seed) not in done]
                runs += [done[(name, l, seed)] for l in losses if (name, l, seed) in done]
                start = start_model(name, args, base_dir, seed, scratch_dir, moments) if todo else None
                for i, loss in enumerate(todo):
                    model = start if i == len(todo) - 1 else copy.deepcopy(start)
                    runs.append(uptrain_one(args, name, loss, seed, model, corpus, teacher, windows, base_logits))
                    with open(log_path, "a") as f:
                        f.write(json.dumps(runs[-1]) + "\n")
                    del model
                del start
    finally:
        shutil.rmtree(scratch_dir, ignore_errors=True)
    return runs


def runs_log(args) -> str:
    """The JSON-lines log of finished runs under --cache, keyed by every setting that shapes a run (--resume)."""
    shaping = {k: v for k, v in vars(args).items()
               if k not in ("seeds", "starts", "losses", "out", "cache", "no_progress", "resume", "retrain_base")}
    key = hashlib.sha256(json.dumps(dict(shaping, base=base_key(args)), sort_keys=True).encode()).hexdigest()[:12]
    return os.path.join(args.cache, f"runs-{key}.jsonl")


def write_report(args, runs, base_dir, base_info, base_val, t0: float) -> None:
    """uptrain.json, uptrain.png and uptrain.md from the runs, and the same tables and sentence on stdout."""
    from . import uptrain_report as rep

    tpstep = args.batch_size * args.seq_len
    stats, cross = rep.summarize(runs), rep.crossover(runs, base_val, tpstep)
    said = rep.sentence(stats, REFERENCES, base_val, len(args.seeds))
    wall, base_tokens = time.time() - t0, args.base_steps * tpstep
    kd = kd_settings(args)
    head = (f"{len(args.seeds)} seeds; base GQA-8 ({HEADS} query heads / {BASE_KV} KV heads, hidden {args.hidden}, "
            f"{args.layers} layers, head_dim {args.head_dim}) trained {args.base_steps} steps x {tpstep} bytes "
            f"(val loss {base_val:.4f}; it fell {base_info['last_quarter_relative_drop']:.1%} over its last quarter); "
            f"starts with {KV} KV heads uptrained {args.uptrain_steps} steps x {tpstep} bytes at peak LR "
            f"{args.uptrain_lr:g} with {' and '.join(l.upper() for l in args.losses)} (KD: {kd.ce_weight:g} CE + "
            f"{kd.kl_weight:g} T^2 KL at T={kd.temperature:g} + {kd.hidden_weight:g} hidden MSE + {kd.attn_weight:g} "
            f"attention-output MSE, {kd.schedule}, teacher the base); references from scratch (CE) "
            f"{args.base_steps + (args.uptrain_steps if args.reference_tokens == 'total' else 0)} steps at "
            f"{args.lr:g}; {wall:.0f} s")
    payload = dict(settings=vars(args), base=dict(base_info, val_loss_eval=base_val, folder=base_dir), runs=runs,
                   stats=stats, crossover=cross, sentence=said, wall_seconds=wall, tokens_per_step=tpstep)
    write_json(os.path.join(args.out, "uptrain.json"), payload)
    rep.plot(runs, base_val, tpstep, os.path.join(args.out, "uptrain.png"),
             f"GQA-8 -> {KV} KV heads: validation loss vs tokens; mean ± std over {len(args.seeds)} seeds")
    tables = (f"{rep.table(stats, REFERENCES)}\n\nValidation loss in nats/byte on the fixed held-out windows; "
              f"KL(base || model) in nats per position; mean ± std over seeds.\n\n{said}\n\n"
              f"### Crossover: tokens to within {rep.WITHIN:.0%} of the base's loss ({(1 + rep.WITHIN) * base_val:.4f})"
              f"\n\nUptraining tokens for a converted start, training tokens for a from-scratch reference; linearly "
              f"interpolated between evaluations; mean ± std over the seeds that reach it.\n\n"
              f"{rep.crossover_table(cross, base_tokens)}\n\n### The curve\n\n{rep.curve_table(runs, tpstep)}\n\n"
              f"![curves](uptrain.png)\n")
    md = f"# Uptraining study: GQA-8 -> {KV} KV heads (written by tools/uptrain_study.py)\n\n{head}.\n\n{tables}"
    write_atomic(os.path.join(args.out, "uptrain.md"), md)
    print("\n" + head + "\n\n" + tables)
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
