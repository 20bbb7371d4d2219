"""Convert a stock Qwen3 checkpoint (GQA or MHA) into a Qwen3-VHA checkpoint with N KV heads, to uptrain.

Every query head becomes a virtual head: physical query heads x one Premix map per KV group, found by a factorization
shared across heads (in weight space, or weighted by the attention inputs of calibration text); the KV heads of each
new group are merged (mean, or a best low-rank fit for the values, absorbed into o_proj); Postmix starts as the
identity. After uptraining (tools/train.py --model_name_or_path OUT_DIR) the model folds back (tools/fold.py) into a
stock GQA-N Qwen3 with the original's query heads. docs/conversion.md says what each method does and why.

Before writing, prints the logit KL of the converted model from the original on held-out standard-library text, for
every method (so the choice is informed; --no-compare: the chosen one only). A checkpoint that came from a fold
converts back exactly (same N and --q-head-dim): its KL is ~0. IN_DIR is never modified; OUT_DIR appears only when
complete.

    bash tools/env.sh python tools/convert_to_vha.py IN_DIR OUT_DIR --kv-heads 2
    bash tools/env.sh python tools/convert_to_vha.py IN_DIR OUT_DIR --kv-heads 2 --method calibrated --calib-tokens 16384
    bash tools/env.sh python tools/convert_to_vha.py IN_DIR OUT_DIR --kv-heads 2 --q-head-dim 64 --dry-run

Methods: mean   queries by the weight-space factorization, keys and values averaged per group (the GQA recipe)
         svd    queries as mean; values by the best rank-d fit of each group, the maps absorbed into o_proj
         calibrated   as svd, both fits weighted by E[x x^T] of each layer's attention input on calibration text
Exit status: 0 done, 2 refused (one line on stderr says why).
"""
from __future__ import annotations

import shutil
import sys
import tempfile

from paddle_vha.cli import (add_converter_options, add_eval_options, command, converter_parser, parse_converter_args,
                            run_transform)


def parse_args(argv=None):
    p = converter_parser(__doc__, "stock Qwen3", "Qwen3-VHA")
    p.add_argument("--kv-heads", type=int, required=True, metavar="N", help="KV heads (= Premix groups) of the result")
    p.add_argument("--q-head-dim", type=int, default=None, metavar="r",
                   help="width of the physical query heads (default: head_dim)")
    p.add_argument("--postmix-rank", type=int, default=4, metavar="R", help="rank of Postmix's head mixing (default 4)")
    p.add_argument("--method", default="svd", choices=["mean", "svd", "calibrated"], help="default svd")
    p.add_argument("--calib-tokens", type=int, default=8192, metavar="T",
                   help="calibration tokens (training split of the embedded corpus) for 'calibrated' (default 8192)")
    p.add_argument("--seed", type=int, default=0, help="seed of Postmix's small U (default 0)")
    p.add_argument("--no-compare", action="store_true", help="evaluate only the chosen method")
    add_converter_options(p)
    add_eval_options(p, "text batches (4 x --eval-len bytes) for the KL; 0 skips it")
    args = parse_converter_args(p, argv)
    if args.calib_tokens < 1:
        p.error("--calib-tokens must be >= 1")
    return args


def _errors_line(errors) -> str:
    import numpy as np

    e = np.array(list(errors.values()))  # (layers, 3)
    return ", ".join(f"{n} {e[:, k].mean():.3e} (max {e[:, k].max():.3e})" for k, n in enumerate(("q", "k", "v")))


def _plan(args):
    from paddle_vha.transform.convert_to_vha import plan_convert

    return plan_convert(args.in_dir, args.out_dir, args.kv_heads, q_head_dim=args.q_head_dim,
                        postmix_rank=args.postmix_rank, method=args.method, dtype=args.dtype, force=args.force,
                        seed=args.seed, max_shard_size=args.max_shard_size)


def _reference(args, plan):
    """(text windows, the original model's logits on them) for the KL, or (None, None) with --eval-batches 0."""
    if args.eval_batches == 0:
        return None, None
    from paddleformers.transformers import Qwen3ForCausalLM

    from paddle_vha.transform.verify import model_logits, text_windows

    windows = text_windows(args.eval_batches, args.eval_len)
    ref = model_logits(plan.in_dir, [x for x, _ in windows], Qwen3ForCausalLM)
    print(f"logit KL(original || converted) on {ref.shape[0] * ref.shape[1]} held-out standard-library byte "
          "tokens, and the mean (max) relative fit error over layers of q, k, v:")
    return windows, ref


def _write(args, plan) -> None:
    """Every other method converted into a scratch folder and its KL printed (unless --no-compare), then the chosen
    one written to OUT_DIR, its KL printed on the complete folder before it becomes OUT_DIR."""
    from paddle_vha.transform import convert_to_vha as cv

    methods = [args.method] if args.no_compare else [m for m in cv.METHODS if m != args.method] + [args.method]
    moments = None
    if "calibrated" in methods:
        moments = cv.calibration_moments(plan.in_dir, args.calib_tokens, seq_len=args.eval_len)
        print(f"calibration: E[x x^T] of {plan.src_cfg.num_hidden_layers} attention inputs over "
              f"{args.calib_tokens} training-split byte tokens")
    windows, ref = _reference(args, plan)

    def report(method, model_dir):
        kl = cv.logit_kl(ref, model_dir, windows) if ref is not None else None
        mark = "  <- written" if method == args.method else ""
        kl_text = f"KL {kl['mean_kl']:.4e} nats/token, max rel logit diff {kl['max_rel']:.3e}; " if kl else ""
        print(f"  {method:<10} {kl_text}fit {_errors_line(plan.errors)}{mark}", flush=True)

    for method in methods[:-1]:  # the others first, in scratch folders
        converted = cv.convert_state(plan, method, moments, progress=not args.no_progress)
        if ref is None:
            report(method, None)
            continue
        scratch = tempfile.mkdtemp(prefix="vha-convert-")
        try:
            report(method, cv.write_candidate(plan, converted, scratch + "/m"))
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        del converted
    converted = cv.convert_state(plan, args.method, moments, progress=not args.no_progress)
    cv.convert_checkpoint(plan, converted, progress=not args.no_progress,
                          check=lambda folder: report(args.method, folder))


def _done(args, plan, seconds: float, written) -> int:
    print(f"wrote {plan.out_dir} in {seconds:.2f} s; uptrain it with tools/train.py "
          f"--model_name_or_path {plan.out_dir}, then fold it with tools/fold.py")
    return 0


@command
def main(argv=None) -> int:
    return run_transform(parse_args(argv), _plan, _write, "converted checkpoint", _done)


if __name__ == "__main__":
    sys.exit(main())
