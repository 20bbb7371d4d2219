"""Convert a stock Qwen3, Llama or Qwen2 checkpoint (GQA or MHA) into a VHA checkpoint over the same base (Qwen3-VHA,
Llama-VHA, Qwen2-VHA) with N KV heads, to uptrain.

Every query head becomes a virtual head: physical query heads x one Premix map per KV group, found by a factorization
shared across heads (in weight space, or weighted by the attention inputs of calibration text); the KV heads of each
new group are merged (mean, or a best low-rank fit for the values, absorbed into o_proj); Postmix starts as the
identity. After uptraining (tools/train.py --model_name_or_path OUT_DIR) the model folds back (tools/fold.py) into a
stock GQA-N model of the original's base with the original's query heads (biases, where the base has them, are
factorized and merged with their weights). docs/conversion.md says what each method does and why.

Before writing, prints the logit KL of the converted model from the original on held-out text, for every method (so
the choice is informed; --no-compare: the chosen one only). Calibration and the KL read --calib-data FILE (.txt, or
.jsonl with a "text" field; default: the embedded standard-library corpus) tokenized with IN_DIR's tokenizer.json;
byte ids only for a byte-level checkpoint (vocabulary < 1024, no tokenizer.json); a larger vocabulary without a
tokenizer is refused. A checkpoint that came from a fold
converts back exactly (same N and --q-head-dim): its KL is ~0. IN_DIR is never modified; OUT_DIR appears only when
complete.

    bash tools/env.sh python tools/convert_to_vha.py IN_DIR OUT_DIR --kv-heads 2   # --method best
    bash tools/env.sh python tools/convert_to_vha.py IN_DIR OUT_DIR --kv-heads 2 --method calibrated --calib-tokens 16384
    bash tools/env.sh python tools/convert_to_vha.py IN_DIR OUT_DIR --kv-heads 2 --q-head-dim 64 --dry-run
    bash tools/env.sh python tools/convert_to_vha.py IN_DIR OUT_DIR --kv-heads 2 --premix off

--premix off (the research fork's kv_postmix_only): no Premix; q_proj is kept as it is, keys and values are merged as
below and Postmix is added over the query heads. With --kv-heads equal to the checkpoint's KV heads it is exact.

--regroup key-similarity | fit-error chooses which old KV heads merge into each new one (non-contiguous groups, the
query heads following; printed per layer); --refine-steps N then refines each layer's attention tensors against the
original's layer output, layer by layer (printing each layer's held-out relative MSE before -> after; a layer that is
exact already is left bit-identical). docs/conversion.md, "Head regrouping" and "Layer-wise refinement".

Methods: best   (default) each method below converted and its KL measured, the lowest written (with nothing
                measured to choose by, --no-compare or --eval-batches 0: calibrated, the real model's ranking)
         mean   queries by the weight-space factorization, keys and values averaged per group (the GQA recipe)
         svd    queries as mean; values by the best rank-d fit of each group, the maps absorbed into o_proj
         calibrated   as svd, both fits weighted by E[x x^T] of each layer's attention input on calibration text
Memory: one decoder layer at a time (weights, calibration and the KL run layer by layer in float32, the logits in
vocabulary blocks), never the whole model: about 0.6 GB + one layer's float32 weights x 12 + --pass-tokens x
(8 hidden + 4 intermediate) x 4 B + (calibrated) layers x hidden^2 x 8 B + (KL) ~0.5 GB + (--refine-steps)
6 x 1.25 x --refine-tokens x hidden x 4 B + 3 forwards of 4 x --eval-len tokens; printed before the work
starts and refused up front, in one line, when /proc/meminfo's MemAvailable is lower. Measured (docs/conversion.md,
"Memory"): Qwen3-0.6B shape (1.2 GB bf16), --method svd with all three KLs: 1.39 GB peak RSS (20.7 GB before).
--refine-steps 20 (4096 tokens) at Qwen3-0.6B widths, 2 layers, --no-compare: 1.19 GB peak RSS.
Exit status: 0 done, 2 refused (one line on stderr says why).
"""
from __future__ import annotations

import sys

import math

from paddle_vha.cli import (add_converter_options, add_eval_options, command, converter_effects, converter_parser,
                            parse_converter_args, run_transform)
from paddle_vha.cli.options import ALWAYS, Effect


def build_parser():
    p = converter_parser(__doc__, "stock Qwen3 / Llama / Qwen2", "VHA")
    p.add_argument("--kv-heads", type=int, required=True, metavar="N", help="KV heads (= Premix groups) of the result")
    p.add_argument("--q-head-dim", type=int, default=None, metavar="r",
                   help="width of the physical query heads (default: head_dim)")
    p.add_argument("--postmix-rank", type=int, default=4, metavar="R", help="rank of Postmix's head mixing (default 4)")
    p.add_argument("--premix", default="on", choices=["on", "off"],
                   help="off: keep every query head as it is and add Postmix only (the research fork's "
                        "kv_postmix_only, vha_enable_premix false); exact when --kv-heads keeps the KV heads")
    p.add_argument("--method", default="best", choices=["best", "mean", "svd", "calibrated"],
                   help="best (default): every method converted and its KL measured, the lowest written; without a "
                        "KL to choose by (--no-compare, --eval-batches 0) calibrated, the real model's ranking "
                        "(SmolLM2, 3 -> 1 KV heads: calibrated 3.79 < mean 7.53 < svd 9.14 nats; docs/conversion.md)")
    p.add_argument("--calib-tokens", type=int, default=8192, metavar="T",
                   help="calibration tokens (random windows of the calibration text) for 'calibrated' (default 8192)")
    p.add_argument("--regroup", default="contiguous", choices=["contiguous", "key-similarity", "fit-error"],
                   help="which old KV heads merge into each new one: contiguous (default), key-similarity (the "
                        "keys' cosine similarity on calibration tokens), fit-error (the smallest k / v fit error); "
                        "non-contiguous groups, the query heads follow their KV head")
    p.add_argument("--refine-steps", type=int, default=0, metavar="N",
                   help="after the fit, refine each layer's attention against the original's layer output, layer "
                        "by layer, N Adam steps per layer (default 0: no refinement)")
    p.add_argument("--refine-lr", type=float, default=1e-3, metavar="LR", help="refinement's peak Adam rate (1e-3)")
    p.add_argument("--refine-tokens", type=int, default=4096, metavar="T",
                   help="calibration tokens the refinement fits on (default 4096; a quarter as many held out)")
    p.add_argument("--seed", type=int, default=0, help="seed of Postmix's small U (default 0)")
    p.add_argument("--no-compare", action="store_true", help="evaluate only the chosen method")
    add_converter_options(p)
    add_eval_options(p, "text batches (4 x --eval-len tokens) for the KL; 0 skips it")
    return p


BY_RANK = "calibrated"  # --method best without a KL to choose by: the best of the real-model ranking


def _calibrates(a) -> bool:
    """Whether E[x x^T] of calibration text is computed: --method calibrated is converted (chosen, by --method best
    too, or compared without --no-compare), or --regroup key-similarity."""
    return a.method in ("calibrated", "best") or not a.no_compare or a.regroup == "key-similarity"


def _measures(a) -> bool:
    """Whether the methods' KLs are measured (and so --method best chooses by them)."""
    return not a.no_compare and a.eval_batches > 0


def _reads_text(a) -> bool:
    return _calibrates(a) or a.eval_batches > 0 or a.refine_steps > 0


_REFINES = Effect("with --refine-steps > 0", lambda a: a.refine_steps > 0)
TAKES_EFFECT = converter_effects(**{
    "--kv-heads": ALWAYS, "--postmix-rank": ALWAYS, "--premix": ALWAYS, "--method": ALWAYS, "--regroup": ALWAYS,
    "--seed": ALWAYS, "--no-compare": ALWAYS, "--eval-batches": ALWAYS, "--refine-steps": ALWAYS,
    # refused by the plan, in its own words, with --premix off (transform/convert_to_vha.py)
    "--q-head-dim": Effect("with --premix on (without Premix the query heads keep head_dim)"),
    "--calib-tokens": Effect("when calibration runs: --method calibrated (or compared, without --no-compare), or "
                             "--regroup key-similarity", _calibrates),
    "--refine-lr": _REFINES, "--refine-tokens": _REFINES,
    "--eval-len": Effect("when text is read: the KL (--eval-batches > 0), calibration or --refine-steps", _reads_text),
    "--calib-data": Effect("when text is read: the KL (--eval-batches > 0), calibration or --refine-steps",
                           _reads_text),
    "--pass-tokens": Effect("when layer-by-layer passes run: the KL (--eval-batches > 0) or calibration",
                            lambda a: a.eval_batches > 0 or _calibrates(a)),
})


def _check_ranges(p, args) -> None:
    from paddle_vha.transform.refine import MAX_STEPS

    if args.calib_tokens < 1:
        p.error("--calib-tokens must be >= 1")
    if args.refine_steps < 0 or args.refine_tokens < 1 or not (math.isfinite(args.refine_lr) and args.refine_lr > 0):
        p.error("--refine-steps must be >= 0, --refine-tokens >= 1 and --refine-lr a finite number > 0")
    if args.refine_steps > MAX_STEPS:
        p.error(f"--refine-steps {args.refine_steps}: at most {MAX_STEPS:,} per layer (the refinement keeps its best "
                "point and converges within hundreds of steps; docs/conversion.md)")
    if not 0 <= args.seed < 2**32:  # numpy's generator: a ValueError traceback before
        p.error(f"--seed {args.seed}: must be in [0, 2**32)")


def parse_args(argv=None):
    return parse_converter_args(build_parser(), argv, TAKES_EFFECT, _check_ranges)


def _errors_line(errors) -> str:
    import numpy as np

    e = np.array(list(errors.values()))  # (layers, 3)
    return ", ".join(f"{n} {e[:, k].mean():.3e} (max {e[:, k].max():.3e})" for k, n in enumerate(("q", "k", "v")))


def _plan(args):
    from paddle_vha.transform.convert_to_vha import plan_convert

    method = BY_RANK if args.method == "best" else args.method
    plan = plan_convert(args.in_dir, args.out_dir, args.kv_heads, q_head_dim=args.q_head_dim,
                        postmix_rank=args.postmix_rank, method=method, dtype=args.dtype, force=args.force,
                        seed=args.seed, max_shard_size=args.max_shard_size, premix=args.premix,
                        regroup=args.regroup)
    if args.method == "best":  # named once the choice is made (_write)
        plan.method = "best (" + ("the lowest KL of the three" if _measures(args) else f"{BY_RANK}: nothing measured "
                                                                                         "to choose by") + ")"
    return plan


def _reference(args, plan, text):
    """(the original's Weights, eval token passes, labels, its final hidden states) for the KL, or None with
    --eval-batches 0."""
    if args.eval_batches == 0:
        return None
    import numpy as np

    from paddle_vha.transform import layerwise as lw

    windows = text.windows("val", args.eval_batches, args.eval_len)
    ids, labels = lw.passes([x for x, _ in windows], args.pass_tokens), np.concatenate([y for _, y in windows])
    ref = lw.folder_weights(plan.source, plan.source_family.model_class)
    print(f"logit KL(original || converted) on {text.describe(labels.size, 'val')}, and the mean (max) relative "
          "fit error over layers of q, k, v:")
    return ref, ids, labels, lw.final_hidden(ref, ids)


def _moments(args, plan, text):
    from paddle_vha.transform import convert_to_vha as cv

    moments = cv.calibration_moments(plan.in_dir, args.calib_tokens, seq_len=args.eval_len, text=text,
                                     pass_tokens=args.pass_tokens)
    batch_tokens = 4 * args.eval_len
    used = -(-args.calib_tokens // batch_tokens) * batch_tokens
    print(f"calibration: E[x x^T] of {plan.src_cfg.num_hidden_layers} attention inputs over "
          f"{text.describe(used, 'train')}", flush=True)
    return moments


def _write(args, plan) -> None:
    """Every other method converted layer by layer and its KL printed (unless --no-compare), then the chosen one
    written to OUT_DIR, its KL printed on the complete folder before it becomes OUT_DIR."""
    from paddle_vha.transform import convert_to_vha as cv
    from paddle_vha.transform import layerwise as lw
    from paddle_vha.transform.text import load_text

    best = args.method == "best"
    chosen = BY_RANK if best else args.method  # --method best: calibrated unless the KLs say otherwise
    methods = [chosen] if args.no_compare else [m for m in cv.METHODS if m != chosen] + [chosen]
    text = None
    calibrate = "calibrated" in methods or args.regroup == "key-similarity"
    if calibrate or args.eval_batches or args.refine_steps:
        text = load_text(plan.in_dir, plan.src_cfg.vocab_size, args.calib_data, cv.ConvertError)
    moments = _moments(args, plan, text) if calibrate else None
    ref = _reference(args, plan, text)

    measured = {}

    def report(method, model, written=False):
        kl = None
        if ref is not None:
            kl = lw.logit_stats(ref[0], ref[3], model, lw.final_hidden(model, ref[1]), ref[2])
            if kl["nonfinite"]:
                raise cv.ConvertError(f"logit KL: the {kl['nonfinite'].replace('compared', 'converted')} model's "
                                      "logits are not finite (NaN or Inf)")
        if kl is not None:
            measured[method] = kl["mean_kl"]
        why = "" if not best else " (the lowest KL: --method best)" if _measures(args) else \
            f" (--method best: {BY_RANK}, the real model's ranking)"
        refined = f" (refined, {args.refine_steps} steps per layer)" if args.refine_steps else ""
        mark = "  <- written" + why + refined if written else ""
        kl_text = f"KL {kl['mean_kl']:.4e} nats/token, max rel logit diff {kl['max_rel']:.3e}; " if kl else ""
        print(f"  {method:<10} {kl_text}fit {_errors_line(plan.errors)}{mark}", flush=True)
        if mark and plan.groups:
            print("  " + groups_line(plan), flush=True)

    choose = best and ref is not None  # every method measured first, the lowest KL written
    for method in methods if choose else methods[:-1]:  # never written: converted layer by layer inside the forward
        tensors = cv.LayerTensors(plan, method, moments)
        if ref is None:
            for i in range(plan.src_cfg.num_hidden_layers):
                tensors(f"model.layers.{i}.self_attn.q_proj.weight")
        report(method, cv.candidate_weights(plan, tensors) if ref is not None else None)
    plan.method = min(measured, key=measured.get) if choose else chosen
    if choose:
        print(f"--method best: {plan.method} has the lowest KL ({measured[plan.method]:.4e} nats/token); writing it",
              flush=True)
    tensors = cv.LayerTensors(plan, plan.method, moments)
    if not args.refine_steps:
        cv.convert_checkpoint(plan, tensors, progress=not args.no_progress,
                              check=lambda folder: report(plan.method, lw.folder_weights(folder), written=True))
        return
    if ref is not None:  # the closed-form start, for comparison with the refined model written
        report(f"{plan.method} (fit)", cv.candidate_weights(plan, tensors))
    from paddle_vha.transform.refine import RefineSettings, refine_and_write, token_counts

    fit, held = token_counts(args.refine_tokens, args.eval_len)
    print(f"refinement: each layer's attention against the original's layer output, {args.refine_steps} Adam steps "
          f"per layer (lr {args.refine_lr}), on {fit} calibration tokens ({fit // args.eval_len} windows of "
          f"{args.eval_len}; {held} held out); relative MSE of each "
          "layer's output on held-out tokens, before -> after:", flush=True)
    refine_and_write(plan, tensors, text, RefineSettings(args.refine_steps, lr=args.refine_lr, seed=args.seed),
                     args.refine_tokens, args.eval_len, progress=not args.no_progress,
                     check=lambda folder: report(plan.method, lw.folder_weights(folder), written=True))


def groups_line(plan) -> str:
    """The old KV heads of each new KV head, per layer (--regroup)."""
    return f"groups (--regroup {plan.regroup}, old KV heads per new one): " + "; ".join(
        f"layer {i} {g}" for i, g in sorted(plan.groups.items()))


def _memory(args, plan):
    """(bytes, formula): paddle_vha/transform/memory.py's terms for this conversion."""
    from paddle_vha.transform import memory as mem

    c = plan.src_cfg
    calibrated = _calibrates(args)
    eval_tokens = args.eval_batches * 4 * args.eval_len
    tokens = max(4 * args.eval_len, min(args.pass_tokens, max(eval_tokens, args.calib_tokens if calibrated else 0)))
    math = mem.tensor_bytes(max(c.num_attention_heads * c.head_dim, c.hidden_size) * c.hidden_size)
    parts = {"base": mem.BASE, "layer math": math, f"forward of {tokens} tokens": mem.forward_bytes(c, tokens,
                                                                                                   args.eval_len)}
    if calibrated:
        parts["moments"] = mem.moments_bytes(c)
        # the calibration text, drawn whole before the pass (10**12 tokens grew to 9.5 GB before it was stopped)
        parts[f"calibration windows of {args.calib_tokens} tokens"] = mem.text_window_bytes(args.calib_tokens,
                                                                                            args.eval_len)
    if args.eval_batches:
        parts["logit blocks"] = mem.logits_bytes(c, eval_tokens)
    if args.refine_steps:
        from paddle_vha.transform.refine import refine_memory

        parts["refinement"] = refine_memory(c, args.refine_tokens, args.eval_len)
    return mem.total(parts)


def _done(args, plan, seconds: float, written) -> int:
    print(f"wrote {plan.out_dir} in {seconds:.2f} s; uptrain it with tools/train.py "
          f"--model_name_or_path {plan.out_dir}, then fold it with tools/fold.py")
    return 0


def _estimate(args, plan):
    """The refinement's work, said before any starts (--refine-steps 10**9 ran until killed, with no word)."""
    if not args.refine_steps:
        return None
    from paddle_vha.machine import gemm_gflops
    from paddle_vha.transform.refine import RefineSettings, refine_estimate

    return refine_estimate(plan.src_cfg, plan.cfg, RefineSettings(args.refine_steps), args.refine_tokens,
                           args.eval_len, gemm_gflops())


@command
def main(argv=None) -> int:
    return run_transform(parse_args(argv), _plan, _write, "converted checkpoint", _done, _memory, _estimate)


if __name__ == "__main__":
    sys.exit(main())
