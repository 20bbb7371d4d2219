"""Fold a Qwen3-VHA checkpoint into a stock Qwen3 GQA checkpoint that computes the same function.

Premix folds into q_proj and Postmix into o_proj (float64 math, one rounding to the output dtype); all other
tensors, tokenizer and generation files are copied. The output loads in stock PaddleFormers or Hugging Face
`Qwen3ForCausalLM` with num_attention_heads = H_v virtual heads and H_kv KV heads. IN_DIR is never modified;
OUT_DIR appears only when complete (written to a temporary folder, then renamed).

    bash tools/env.sh python tools/fold.py runs/quickstart/vha runs/quickstart/gqa --verify
    bash tools/env.sh python tools/fold.py IN OUT --dry-run             # print the plan, write nothing
    bash tools/env.sh python tools/fold.py IN OUT --dtype bfloat16 --force

Exit status: 0 done, 2 refused (one line on stderr says why), 1 --verify above tolerance.
"""
from __future__ import annotations

import argparse
import sys
import time


from paddle_vha.cli import add_converter_options, command, fail, quiet, report_verify


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("in_dir", metavar="IN_DIR", help="Qwen3-VHA checkpoint folder (config.json + safetensors)")
    p.add_argument("out_dir", metavar="OUT_DIR", help="where the stock Qwen3 checkpoint goes (must not exist)")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "float64", "bfloat16", "float16"],
                   help="output dtype; auto = the input's (default auto)")
    add_converter_options(p)
    p.add_argument("--verify", type=int, nargs="?", const=4, default=None, metavar="N",
                   help="after folding, load both models in Paddle, run N random sequences (default 4) and compare logits")
    p.add_argument("--verify-len", type=int, default=32, help="tokens per --verify sequence (default 32)")
    p.add_argument("--verify-tol", type=float, default=None,
                   help="max relative logit difference --verify accepts (default by output dtype: "
                        "1e-4 float32/64, 1e-2 float16, 5e-2 bfloat16)")
    args = p.parse_args(argv)
    if args.verify is not None and args.verify < 1:
        p.error("--verify N must be >= 1")
    if args.verify_len < 1:
        p.error("--verify-len must be >= 1")
    return args


@command
def main(argv=None) -> int:
    args = parse_args(argv)
    quiet()
    from paddle_vha.checkpoint.contract import CheckpointError
    from paddle_vha.vha.fold import DEFAULT_VERIFY_TOL, fold_checkpoint, format_plan, plan_fold
    from paddle_vha.checkpoint.safetensors_io import dtype_name

    try:
        plan = plan_fold(args.in_dir, args.out_dir, dtype=args.dtype, force=args.force,
                         max_shard_size=args.max_shard_size)
    except CheckpointError as e:
        fail(str(e))
    print(format_plan(plan))
    if args.dry_run:
        print("dry run: nothing written")
        return 0

    t0 = time.perf_counter()
    try:
        fold_checkpoint(plan, progress=not args.no_progress)
    except CheckpointError as e:  # a NaN / Inf or an overflowing cast found while writing: nothing was written
        fail(str(e))
    except OSError as e:
        fail(f"{args.out_dir}: could not write the folded checkpoint ({e.strerror or e})")
    dt = time.perf_counter() - t0
    print(f"wrote {plan.out_dir}: {plan.bytes_out / 1e6:.3f} MB in {dt:.2f} s "
          f"({(plan.bytes_in + plan.bytes_out) / 1e9 / max(dt, 1e-9):.2f} GB/s read+written)")

    if args.verify is None:
        return 0
    import logging

    from paddle_vha.vha.fold import verify_fold

    # Paddle's checkpoint loader logs INFO lines per load through this logger, which quiet() does not cover.
    logging.getLogger("paddle.distributed.fleet.utils.log_util").setLevel(logging.WARNING)

    out_name = dtype_name(plan.out_dtype)
    tol = args.verify_tol if args.verify_tol is not None else DEFAULT_VERIFY_TOL[out_name]
    r = verify_fold(args.in_dir, args.out_dir, num_sequences=args.verify, seq_len=args.verify_len)
    return report_verify(r, tol, f"{args.verify} x {args.verify_len} random tokens, Paddle float32, VHA vs folded",
                         sides=("the VHA model's", "the folded model's"))


if __name__ == "__main__":
    sys.exit(main())
