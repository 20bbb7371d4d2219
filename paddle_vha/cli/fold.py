"""Fold a Qwen3-VHA checkpoint into a stock Qwen3 GQA checkpoint that computes the same function (a Qwen3-MoE-VHA
checkpoint into a stock Qwen3-MoE one: the router and the experts copied, the attention folded the same way).

Premix folds into q_proj and Postmix into o_proj (float64 math, one rounding to the output dtype); all other
tensors, tokenizer and generation files are copied. The output loads in stock PaddleFormers or Hugging Face
`Qwen3ForCausalLM` with num_attention_heads = H_v virtual heads and H_kv KV heads. IN_DIR is never modified;
OUT_DIR appears only when complete (written to a temporary folder, then renamed).

    bash tools/env.sh python tools/fold.py runs/quickstart/vha runs/quickstart/gqa --verify
    bash tools/env.sh python tools/fold.py IN OUT --dry-run             # print the plan, write nothing
    bash tools/env.sh python tools/fold.py IN OUT --dtype bfloat16 --force

Memory: one tensor at a time (its float64 math: ~6 x the largest folded tensor's elements x 8 B) + ~0.6 GB; --verify
runs both models one decoder layer at a time (float32) and holds N x len x vocabulary x 8 B x 7 of logits; a MoE
fold's --verify (float64 numpy) holds the largest tensor as read and as float64 (~10 B per element) instead of the
Paddle forward (measured at the 30B-A3B widths, 2 layers, 128 experts, float16: 3.39 GB peak, 4.17 GB printed). Printed
first, refused up front in one line when /proc/meminfo's MemAvailable is lower.
Exit status: 0 done, 2 refused (one line on stderr says why), 1 --verify above tolerance.
"""
from __future__ import annotations

import sys

from paddle_vha.cli import (add_converter_options, add_verify_options, command, converter_effects, converter_parser,
                            parse_converter_args, run_transform, verify_step)


def build_parser():
    p = converter_parser(__doc__, "Qwen3-VHA", "stock Qwen3")
    add_converter_options(p)
    add_verify_options(p, 4, 32, None,
                       "after folding, load both models in Paddle, run N random sequences (default 4) and compare logits",
                       "max relative logit difference --verify accepts (default by output dtype: "
                       "1e-4 float32/64, 1e-2 float16, 5e-2 bfloat16)")
    return p


TAKES_EFFECT = converter_effects(verify=True)


def parse_args(argv=None):
    return parse_converter_args(build_parser(), argv, TAKES_EFFECT)


def _plan(args):
    from paddle_vha.transform import fold

    return fold.plan_fold(args.in_dir, args.out_dir, dtype=args.dtype, force=args.force,
                          max_shard_size=args.max_shard_size)


def _write(args, plan):
    from paddle_vha.transform import fold

    fold.fold_checkpoint(plan, progress=not args.no_progress)


def _memory(args, plan):
    """(bytes, formula): the largest folded tensor's float64 math, and --verify's two layer-by-layer forwards."""
    import math

    from paddle_vha.transform import memory as mem

    c = plan.cfg
    parts = {"base": mem.BASE, "tensor math": mem.tensor_bytes(max([math.prod(e.shape) for e in plan.entries
                                                                    if e.how != "copy"] or [0]))}
    if args.verify:
        tokens = args.verify * args.verify_len
        if plan.verify_numpy:  # MoE: both checkpoints in float64 numpy, one tensor at a time (as read + as float64)
            largest = max(math.prod(r.shape) for r in plan.inputs.values())
            parts[f"verify numpy forward of {tokens} tokens"] = (8 + 2) * largest
        else:
            parts[f"verify forward of {tokens} tokens"] = mem.forward_bytes(c, tokens, args.verify_len)
        parts["verify logits"] = mem.verify_logits_bytes(c, tokens)
    return mem.total(parts)


def _done(args, plan, seconds: float, written) -> int:
    from paddle_vha.checkpoint.safetensors_io import dtype_name
    from paddle_vha.transform import fold

    print(f"wrote {plan.out_dir}: {plan.bytes_out / 1e6:.3f} MB in {seconds:.2f} s "
          f"({(plan.bytes_in + plan.bytes_out) / 1e9 / max(seconds, 1e-9):.2f} GB/s read+written)")
    tol = args.verify_tol if args.verify_tol is not None else fold.DEFAULT_VERIFY_TOL[dtype_name(plan.out_code)]
    return verify_step(args, lambda: fold.verify_fold(args.in_dir, args.out_dir, num_sequences=args.verify,
                                                      seq_len=args.verify_len),
                       tol, f"{args.verify} x {args.verify_len} random tokens, {plan.verify_how}",
                       sides=("the VHA model's", "the folded model's"))


@command
def main(argv=None) -> int:
    return run_transform(parse_args(argv), _plan, _write, "folded checkpoint", _done, _memory)


if __name__ == "__main__":
    sys.exit(main())
