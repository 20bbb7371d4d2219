"""Export a folded (stock Qwen3) checkpoint to an ONNX decoder with KV cache, and validate it.

    python tools/export_onnx.py FOLDED_DIR OUT_DIR [--cache concat|buffer] [--external-data] [--opset 17]
                                [--decode-steps 16] [--force] [--weights fp32|int8|int4] [--block-size 128]
                                [--max-kl NATS] [--min-agreement FRACTION]

Goes through Paddle's own route (jit.save of a static program, then paddle2onnx) and checks the result as
Optimum does: onnx.checker full check, standard ONNX ops only, KV inputs with H_kv heads, and onnxruntime vs
Paddle logits for a prefill and greedy decode steps (fp32, max abs diff <= --tolerance x max(1, max |logit|)). I/O follows the
onnxruntime-genai / Optimum convention: input_ids, attention_mask, position_ids, past_key_values.{i}.key/.value
[batch, H_kv, past, head_dim] -> logits, present.{i}.key/.value. OUT_DIR also gets the static Paddle program
(OUT_DIR/paddle/) for Paddle Inference. Nothing is written unless everything passes.

--cache buffer writes the in-place flavour instead (docs/deploy.md): the cache goes in as the runtime's buffers and
only the new positions come out (new.{i}.key/.value), so nothing copies the cache; paddle_vha.serve and
tools/generate.py run it, onnxruntime-genai and Optimum do not.

Weights go to OUT_DIR/model.onnx.data (ONNX external data, beside a model.onnx of a few MB) when they would push the
graph past protobuf's 2 GB limit (e.g. any Qwen3-0.6B: 2.4 GB in float32), or always with --external-data; any
size exports the same way (the program converted without its weights, then the weights attached).

--weights int8 / int4 quantizes the validated float32 graph with onnxruntime's own block quantizer (weight-only,
symmetric blocks of --block-size along the input axis, float32 scales; default 128, the one recommendation of
docs/deploy.md; the block size is tried on the quantizer before any work; the LM head too, tied or not, unless
--float-lm-head; the embedding, the RMSNorms including q_norm / k_norm, attention and the cache stay float32), then
prints its quality against the float32 graph on held-out text (mean logit KL, greedy-token agreement on decisive
positions) and fails outside the format's bounds (int8: KL <= 0.01 nats, agreement >= 95%; int4: 0.25, 80%;
docs/deploy.md, "The quality gate"); --max-kl / --min-agreement replace a bound knowingly (said in the quality line
and export_info.json). The graph then uses onnxruntime's contrib op MatMulNBits (onnxruntime, onnxruntime-genai and
paddle_vha.serve run it; paddle/ keeps the float32 program). fp16 / bf16 are refused: onnxruntime's CPU EP casts
float16 weights back to float32 (no gain).

Memory: about 0.5 GB + 1.7 x the float32 weights (4 bytes per parameter: 4.6 GB for Qwen3-0.6B, 12.2 GB for
Qwen3-1.7B), and for --weights int8 / int4 that plus the largest tensor (the quantization reads one weight at a time
from model.onnx.data); refused up front, in one line and before reading any weight, when the machine's available
memory (MemAvailable, plus what the process already holds) is below it. Measured peak RSS (docs/reliability.md):
Qwen3-0.6B fp32 / int8 / int4 3.86 / 4.47 / 4.32 GB (1.62 / 1.88 / 1.81 x its 2.38 GB of float32 weights),
Qwen3-1.7B 9.15 / 9.25 / 9.23 GB (1.33 / 1.34 / 1.34 x its 6.88 GB).
"""
from __future__ import annotations

import argparse
import math
import sys


from paddle_vha.cli import command, fail, quiet
from paddle_vha.cli.options import ALWAYS, PERMISSION, Effect, parse_checked
from paddle_vha.export.quantize import BLOCK_SIZES, DEFAULT_BLOCK_SIZE


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("folded_dir", help="stock Qwen3 checkpoint folder (e.g. the output of tools/fold.py)")
    p.add_argument("out_dir", help="where to write model.onnx, paddle/ and export_info.json")
    p.add_argument("--opset", type=int, default=17, help="ONNX opset, >= 14 (default 17)")
    p.add_argument("--decode-steps", type=int, default=16, help="greedy decode steps checked (default 16)")
    p.add_argument("--tolerance", type=float, default=1e-4,
                   help="max abs logit diff allowed per unit of the largest logit (at least 1): 1e-4 (default) "
                        "allows 1e-4 for logits within +-1, 3.3e-3 for a model whose logits reach 33")
    p.add_argument("--force", action="store_true", help="replace OUT_DIR if it exists")
    p.add_argument("--cache", default="concat", choices=["concat", "buffer"],
                   help="cache interface: concat (default; present = past + new, what onnxruntime-genai and Optimum "
                        "run) or buffer (the in-place flavour paddle_vha.serve runs: faster at long context)")
    p.add_argument("--external-data", action="store_true",
                   help="store the weights in model.onnx.data even under 2 GB (over it they always are)")
    p.add_argument("--weights", default="fp32", choices=["fp32", "fp16", "bf16", "int8", "int4"],
                   help="weight format of model.onnx (default fp32; fp16 / bf16 are refused with the reason)")
    p.add_argument("--block-size", type=int, default=None,
                   help=f"values per quantization block for int8 / int4: {', '.join(map(str, BLOCK_SIZES))} "
                        f"(onnxruntime's quantizer; default {DEFAULT_BLOCK_SIZE}, docs/deploy.md)")
    p.add_argument("--float-lm-head", action="store_true", help="keep the LM head float32 when quantizing")
    p.add_argument("--max-kl", type=float, default=None, metavar="NATS",
                   help="int8 / int4: accept a mean KL from the float32 export up to NATS instead of the format's "
                        "bound (int8 0.01, int4 0.25; docs/deploy.md, 'the quality gate')")
    p.add_argument("--min-agreement", type=float, default=None, metavar="FRACTION",
                   help="int8 / int4: accept a greedy-token agreement on decisive positions down to FRACTION (0..1) "
                        "instead of the format's bound (int8 0.95, int4 0.80)")
    return p


QUANTIZED = Effect("with --weights int8 / int4", lambda a: a.weights in ("int8", "int4"))
TAKES_EFFECT = {
    "folded_dir": ALWAYS, "out_dir": ALWAYS, "--opset": ALWAYS, "--decode-steps": ALWAYS, "--tolerance": ALWAYS,
    "--force": PERMISSION, "--cache": ALWAYS, "--weights": ALWAYS,
    "--external-data": Effect("always (over 2 GB the weights are external data anyway)"),
    "--block-size": QUANTIZED, "--float-lm-head": QUANTIZED, "--max-kl": QUANTIZED, "--min-agreement": QUANTIZED,
}


def _check_ranges(p, args) -> None:
    if args.decode_steps < 1:
        p.error("--decode-steps must be >= 1")
    if not (math.isfinite(args.tolerance) and args.tolerance >= 0):  # NaN failed only after the whole export
        p.error(f"--tolerance {args.tolerance}: must be a finite number >= 0")
    if args.max_kl is not None and not (math.isfinite(args.max_kl) and args.max_kl >= 0):
        p.error(f"--max-kl {args.max_kl}: must be a finite number of nats >= 0")
    if args.min_agreement is not None and not 0 <= args.min_agreement <= 1:  # NaN fails this too
        p.error(f"--min-agreement {args.min_agreement}: must be a fraction in [0, 1] (0.8 is 80%)")


@command
def main(argv=None):
    p = build_parser()
    args, _ = parse_checked(p, argv, TAKES_EFFECT, _check_ranges)
    from paddle_vha.export.errors import ExportError
    from paddle_vha.export.quality import gate_bounds
    from paddle_vha.export.quantize import check_weights

    try:  # before Paddle is even imported: a refused format or block size costs nothing
        check_weights(args.weights, args.block_size)
    except ExportError as e:
        fail(str(e))
    bounds = gate_bounds(args.weights, args.max_kl, args.min_agreement) if args.weights in ("int8", "int4") else None
    quiet()
    from paddle_vha.checkpoint.contract import CheckpointError
    from paddle_vha.export.onnx_export import export_onnx

    try:
        export_onnx(args.folded_dir, args.out_dir, opset=args.opset, decode_steps=args.decode_steps,
                    tolerance=args.tolerance, force=args.force, cache_io=args.cache,
                    external_data=args.external_data or None, weights=args.weights, block_size=args.block_size,
                    quantize_lm_head=not args.float_lm_head, quality_bounds=bounds)
    except (CheckpointError, ExportError) as e:
        fail(str(e))
    print(f"wrote {args.out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
