"""Compress the KV cache of a stock Qwen3, Llama or Qwen2 checkpoint into an MEA checkpoint over the same base (the MEA
paper's SVD).

In the chosen layers, k_proj / v_proj keep only N physical KV heads (the top N singular directions of the
per-head weight matrix); HLC coefficients rebuild the original KV heads from them, so the cache of those
layers shrinks by N / (original KV heads). Prints the per-layer relative reconstruction error of W_K and W_V,
then the logit KL of compressed vs original on held-out text (--calib-data FILE, default the embedded
standard-library corpus) tokenized with IN_DIR's tokenizer.json (byte ids for a byte-level checkpoint). With N = the
original KV head count the conversion is exact (logits agree to float rounding). IN_DIR is never modified; OUT_DIR
appears only when complete.

    bash tools/env.sh python tools/compress_kv.py IN_DIR OUT_DIR --kv-heads 4 --layers all
    bash tools/env.sh python tools/compress_kv.py IN_DIR OUT_DIR --kv-heads 2 --layers deep --dry-run
    bash tools/env.sh python tools/compress_kv.py IN_DIR OUT_DIR --kv-heads 2 --layers 12-35 --k-norm before

Memory: one layer's SVD at a time; the KL runs one decoder layer at a time in float32 (logits in vocabulary blocks):
about 0.6 GB + one layer's float32 weights x 12 + the KL tokens x (8 hidden + 4 intermediate) x 4 B + ~0.5 GB;
printed first and refused up front, in one line, when /proc/meminfo's MemAvailable is lower (docs/mea.md).

--layers: all | deep (all but the first 3, the paper's deep setting) | A-B (inclusive) | i,j,k.
Exit status: 0 done, 2 refused (one line on stderr says why).
"""
from __future__ import annotations

import sys

from paddle_vha.cli import (add_converter_options, add_eval_options, command, converter_effects, converter_parser,
                            parse_converter_args, run_transform)
from paddle_vha.cli.options import ALWAYS, Effect


def build_parser():
    p = converter_parser(__doc__, "stock Qwen3 / Llama / Qwen2", "MEA")
    p.add_argument("--kv-heads", type=int, required=True, metavar="N", help="physical KV heads kept in compressed layers")
    p.add_argument("--layers", default="all", help="all | deep | A-B | i,j,k (default all)")
    p.add_argument("--k-norm", default="after", choices=["after", "before"],
                   help="Qwen3's k_norm after HLC (default; exact at N = original heads) or before it (cache "
                        "post-norm/post-RoPE, multi-query serving form); Llama and Qwen2 have no k_norm: the same "
                        "function either way; see docs/mea.md")
    add_converter_options(p)
    add_eval_options(p, "text batches for the logit KL; 0 skips it (default 4)")
    return p


_KL = Effect("with --eval-batches > 0 (the logit KL is the only text compress_kv reads)", lambda a: a.eval_batches > 0)
# over Llama / Qwen2 (no k_norm) both positions are the same function: refused by _plan once IN_DIR is read
K_NORM = Effect("over a base with a k_norm (Qwen3; Llama and Qwen2 have none, and both positions are then the same "
                "function)")
TAKES_EFFECT = converter_effects(**{"--kv-heads": ALWAYS, "--layers": ALWAYS, "--k-norm": K_NORM,
                                    "--eval-batches": ALWAYS, "--eval-len": _KL, "--calib-data": _KL,
                                    "--pass-tokens": _KL})


def parse_args(argv=None):
    return parse_converter_args(build_parser(), argv, TAKES_EFFECT)


def _plan(args):
    from paddle_vha.transform.compress_kv import CompressError, plan_compress

    plan = plan_compress(args.in_dir, args.out_dir, args.kv_heads, layers=args.layers, k_norm=f"{args.k_norm}_hlc",
                         dtype=args.dtype, force=args.force, max_shard_size=args.max_shard_size)
    base = plan.source_family.base
    if "k_norm" in getattr(args, "given_options", ()) and not base.has("self_attn.k_norm.weight"):
        raise CompressError(f"--k-norm has no effect in this run: it takes effect {K_NORM.when} ({args.in_dir} is a "
                            f"{plan.source_family.label} checkpoint)")
    return plan


def _write(args, plan) -> dict:
    """Compress and write; returns the logit KL (empty with --eval-batches 0)."""
    from paddle_vha.transform import compress_kv as compress
    from paddle_vha.transform.text import load_text

    kl = {}
    text = None
    if args.eval_batches:  # read and tokenized first: a text it cannot use is refused before any work
        text = load_text(plan.in_dir, plan.cfg.vocab_size, args.calib_data, compress.CompressError)

    def check(folder):  # the KL runs on the complete folder before it becomes OUT_DIR: a failure leaves nothing
        kl.update(compress.logit_kl(args.in_dir, folder, batches=args.eval_batches, seq_len=args.eval_len,
                                    text=text, pass_tokens=args.pass_tokens))

    compress.compress_checkpoint(plan, progress=not args.no_progress, check=check if args.eval_batches else None)
    return kl


def _memory(args, plan):
    """(bytes, formula): paddle_vha/transform/memory.py's terms for this compression."""
    from paddle_vha.transform import memory as mem

    c = plan.cfg
    tokens = max(4 * args.eval_len, min(args.pass_tokens, args.eval_batches * 4 * args.eval_len))
    parts = {"base": mem.BASE, "layer math": mem.tensor_bytes(c.mea_kv_heads * c.head_dim * c.hidden_size)}
    if args.eval_batches:
        parts[f"forward of {tokens} tokens"] = mem.forward_bytes(c, tokens, args.eval_len)
        parts["logit blocks"] = mem.logits_bytes(c, args.eval_batches * 4 * args.eval_len)
    return mem.total(parts)


def _done(args, plan, seconds: float, kl: dict) -> int:
    print(f"wrote {plan.out_dir} in {seconds:.2f} s")
    print(f"{'layer':>5} {'rel err W_K':>12} {'rel err W_V':>12}")
    for i, (ek, ev) in sorted(plan.errors.items()):
        print(f"{i:>5} {ek:>12.4e} {ev:>12.4e}")
    if kl:
        print(f"logit KL(original || compressed) on {kl['text']}: {kl['mean_kl']:.4e} "
              f"nats/token (original cross-entropy {kl['orig_ce']:.3f}); max |logit diff| / max |logit| = "
              f"{kl['max_rel']:.3e}")
    return 0


@command
def main(argv=None) -> int:
    return run_transform(parse_args(argv), _plan, _write, "compressed checkpoint", _done, _memory)


if __name__ == "__main__":
    sys.exit(main())
