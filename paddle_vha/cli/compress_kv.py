"""Compress the KV cache of a stock Qwen3 checkpoint into a Qwen3-MEA checkpoint (the MEA paper's SVD).

In the chosen layers, k_proj / v_proj keep only N physical KV heads (the top N singular directions of the
per-head weight matrix); HLC coefficients rebuild the original KV heads from them, so the cache of those
layers shrinks by N / (original KV heads). Prints the per-layer relative reconstruction error of W_K and W_V,
then the logit KL of compressed vs original on standard-library text (byte tokens). With N = the original KV
head count the conversion is exact (logits agree to float rounding). IN_DIR is never modified; OUT_DIR appears
only when complete.

    bash tools/env.sh python tools/compress_kv.py IN_DIR OUT_DIR --kv-heads 4 --layers all
    bash tools/env.sh python tools/compress_kv.py IN_DIR OUT_DIR --kv-heads 2 --layers deep --dry-run
    bash tools/env.sh python tools/compress_kv.py IN_DIR OUT_DIR --kv-heads 2 --layers 12-35 --k-norm before

--layers: all | deep (all but the first 3, the paper's deep setting) | A-B (inclusive) | i,j,k.
Exit status: 0 done, 2 refused (one line on stderr says why).
"""
from __future__ import annotations

import argparse
import sys
import time


from paddle_vha.cli import add_converter_options, command, fail, quiet


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("in_dir", metavar="IN_DIR", help="stock Qwen3 checkpoint folder (config.json + safetensors)")
    p.add_argument("out_dir", metavar="OUT_DIR", help="where the Qwen3-MEA checkpoint goes (must not exist)")
    p.add_argument("--kv-heads", type=int, required=True, metavar="N", help="physical KV heads kept in compressed layers")
    p.add_argument("--layers", default="all", help="all | deep | A-B | i,j,k (default all)")
    p.add_argument("--k-norm", default="after", choices=["after", "before"],
                   help="Qwen3's k_norm after HLC (default; exact at N = original heads) or before it "
                        "(cache post-norm/post-RoPE, multi-query serving form); see docs/mea.md")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "float64", "bfloat16", "float16"],
                   help="output dtype; auto = the input's (default auto)")
    add_converter_options(p, shard_help="largest output shard (default 5GB)")
    p.add_argument("--eval-batches", type=int, default=4, help="text batches for the logit KL; 0 skips it (default 4)")
    p.add_argument("--eval-len", type=int, default=128, help="tokens per evaluation sequence (default 128)")
    args = p.parse_args(argv)
    if args.eval_batches < 0 or args.eval_len < 2:
        p.error("--eval-batches must be >= 0 and --eval-len >= 2")
    return args


@command
def main(argv=None) -> int:
    args = parse_args(argv)
    quiet()
    from paddle_vha.checkpoint.contract import CheckpointError
    from paddle_vha.mea.compress import compress_checkpoint, format_plan, logit_kl, plan_compress

    try:
        plan = plan_compress(args.in_dir, args.out_dir, args.kv_heads, layers=args.layers,
                             k_norm=f"{args.k_norm}_hlc", dtype=args.dtype, force=args.force)
    except CheckpointError as e:
        fail(str(e))
    print(format_plan(plan))
    if args.dry_run:
        print("dry run: nothing written")
        return 0

    t0 = time.perf_counter()
    kl = {}

    def check(folder):  # the KL runs on the complete folder before it becomes OUT_DIR: a failure leaves nothing
        kl.update(logit_kl(args.in_dir, folder, batches=args.eval_batches, seq_len=args.eval_len))

    try:
        compress_checkpoint(plan, progress=not args.no_progress, max_shard_size=args.max_shard_size,
                            check=check if args.eval_batches else None)
    except CheckpointError as e:
        fail(str(e))
    except OSError as e:
        fail(f"{args.out_dir}: could not write the compressed checkpoint ({e.strerror or e})")
    print(f"wrote {plan.out_dir} in {time.perf_counter() - t0:.2f} s")
    print(f"{'layer':>5} {'rel err W_K':>12} {'rel err W_V':>12}")
    for i, (ek, ev) in sorted(plan.errors.items()):
        print(f"{i:>5} {ek:>12.4e} {ev:>12.4e}")
    if kl:
        r = kl
        print(f"logit KL(original || compressed) on {r['tokens']} standard-library byte tokens: {r['mean_kl']:.4e} nats/token "
              f"(original cross-entropy {r['orig_ce']:.3f}); max |logit diff| / max |logit| = {r['max_rel']:.3e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
