"""Export a folded (stock Qwen3) checkpoint to an ONNX decoder with KV cache, and validate it.

    python tools/export_onnx.py FOLDED_DIR OUT_DIR [--cache concat|buffer] [--external-data] [--opset 17]
                                [--decode-steps 16] [--force] [--weights fp32|int8|int4] [--block-size 128]
                                [--max-kl NATS] [--min-agreement FRACTION] [--kv-cache fp32|int8]
                                [--quant-recipe rtn|symsearch|asym|search|awq] [--mixed ROLES] [--float-embedding]
                                [--calibration-text FILE] [--paddle-program]

Goes through Paddle's own route (jit.save of a static program, then paddle2onnx) and checks the result as
Optimum does: onnx.checker full check, standard ONNX ops only, KV inputs with H_kv heads, and onnxruntime vs
Paddle logits for a prefill and greedy decode steps (fp32, max abs diff <= --tolerance x max(1, max |logit|)). I/O follows the
onnxruntime-genai / Optimum convention: input_ids, attention_mask, position_ids, past_key_values.{i}.key/.value
[batch, H_kv, past, head_dim] -> logits, present.{i}.key/.value. An fp32 OUT_DIR also gets the static Paddle program
(OUT_DIR/paddle/) for Paddle Inference. Nothing is written unless everything passes.

--cache buffer writes the in-place flavour instead (docs/deploy.md): the cache goes in as the runtime's buffers and
only the new positions come out (new.{i}.key/.value), so nothing copies the cache; paddle_vha.serve and
tools/generate.py run it, onnxruntime-genai and Optimum do not.

Weights go to OUT_DIR/model.onnx.data (ONNX external data, beside a model.onnx of a few MB) when they would push the
graph past protobuf's 2 GB limit (e.g. any Qwen3-0.6B: 2.4 GB in float32), or always with --external-data; any
size exports the same way (the program converted without its weights, then the weights attached).

--weights int8 / int4 quantizes the validated float32 graph into onnxruntime's stock contrib ops (MatMulNBits for every
linear layer and the LM head, GatherBlockQuantized for the embedding table: onnxruntime, onnxruntime-genai and
Optimum load it), weight-only, in blocks of --block-size values along the input axis (default 32), each block with
a float32 scale and a uint8 zero point. The default recipe (--quant-recipe) is the one measured best on a real model
against llama.cpp (docs/deploy.md, "Quantized exports on a real model"): int4 'awq' (a per-block scale / zero-point
search weighted by the activations measured on the calibration text) with v_proj, down_proj and the LM head in 8
bits (--mixed; 'none' for all 4-bit; the 8-bit ones in symmetric blocks of 64), the tied embedding one table with
the head; int8 'awq' too. 'rtn' is
onnxruntime's symmetric round to nearest, the old default (--quant-recipe rtn --block-size 128 --mixed none
--float-embedding reproduces it). The quantization calibrates on --calibration-text FILE (its first 90%; default: the
embedded English prose + Python code) and its quality gate reads the file's held-out last 10%: mean logit KL against
the float32 graph and greedy-token agreement on decisive positions, failing outside the format's bounds (int8: KL <=
0.01 nats, agreement >= 95%; int4: 0.25, 80%; docs/deploy.md, "The quality gate"); --max-kl / --min-agreement
replace a bound knowingly (said in the quality line and export_info.json). A quantized folder holds what its
onnxruntime deployment needs; the float32 Paddle program for Paddle Inference (paddle/) is kept with
--paddle-program (an fp32 export always has it). fp16 / bf16 are refused: onnxruntime's CPU EP casts float16
weights back to float32 (no gain).

--kv-cache int8 stores the KV cache in 8 bits (paddle_vha/export/kv_cache.py): each token's key and value per KV head
in 8 bits with a float32 scale (the largest |x| / 127), 264 bytes a position per KV head at head_dim 128 instead of
float32's 1,024; attention reads it with onnxruntime's MatMulIntegerToFloat (contrib domain), and each step
writes only its new tokens (in place, with --cache buffer). The validated graph is rewritten after any weight
quantization, and its logits over held-out text read through the cache (2 windows of 320 tokens, prefilled 64 at a time,
the last 32 one step each) must stay within the bounds against the float32 cache (mean KL <= 0.01 nats, agreement >=
95%), or nothing is written. onnxruntime and paddle_vha.serve run it; onnxruntime-genai (no genai_config.json) and
Paddle Inference (paddle/ keeps the float32-cache program) do not. fp16 / bf16 are refused: onnxruntime's CPU EP has
no 16-bit MatMul, so such a cache would be cast to float32 whole every step.

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
from paddle_vha.export.quant_plan import MIXED_DEFAULT
from paddle_vha.export.quantize import BLOCK_SIZES


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
                        "(what onnxruntime's MatMulNBits takes; default 32, docs/deploy.md)")
    p.add_argument("--float-lm-head", action="store_true", help="keep the LM head float32 when quantizing")
    p.add_argument("--quant-recipe", default=None, choices=["rtn", "symsearch", "asym", "search", "awq"],
                   help="how each block's codes, scale and zero point are chosen (default: awq for int4, search for "
                        "int8): rtn = onnxruntime's symmetric round to nearest (the old default); asym = zero points; "
                        "search = asym + a per-block scale search with least-squares refits (symsearch: the same without zero points); awq = search weighted by "
                        "the activations measured on the calibration text (docs/deploy.md)")
    p.add_argument("--mixed", default=None, metavar="ROLES",
                   help="int4: comma-separated roles stored in 8 bits (q_proj k_proj v_proj o_proj gate_proj up_proj "
                        "down_proj lm_head, each optionally @FIRST-LAST layers, e.g. down_proj@0-7); 'none' for all "
                        f"4-bit; default {','.join(MIXED_DEFAULT)} (chosen from the measured sensitivity table; "
                        "the 8-bit weights in symmetric blocks of 64)")
    p.add_argument("--float-embedding", action="store_true",
                   help="keep the embedding table float32 (default: quantized and read by GatherBlockQuantized; a "
                        "tied table is one initializer with the LM head's)")
    p.add_argument("--calibration-text", default=None, metavar="FILE",
                   help="UTF-8 text (.txt, or .jsonl with a \"text\" field) the quantization calibrates on (its first "
                        "90%%) and the quality gate reads (its last 10%%); default: the embedded English prose + "
                        "Python text (paddle_vha/export/data/README.md)")
    p.add_argument("--paddle-program", action="store_true",
                   help="keep the static float32 Paddle program (paddle/, for Paddle Inference) in a quantized "
                        "export's folder too (an fp32 export always has it)")
    p.add_argument("--max-kl", type=float, default=None, metavar="NATS",
                   help="int8 / int4: accept a mean KL from the float32 export up to NATS instead of the format's "
                        "bound (int8 0.01, int4 0.25; docs/deploy.md, 'the quality gate')")
    p.add_argument("--min-agreement", type=float, default=None, metavar="FRACTION",
                   help="int8 / int4: accept a greedy-token agreement on decisive positions down to FRACTION (0..1) "
                        "instead of the format's bound (int8 0.95, int4 0.80)")
    p.add_argument("--kv-cache", default="fp32", choices=["fp32", "int8", "fp16", "bf16"],
                   help="KV cache format (default fp32; int8: per-token scales, a quarter of the bytes; fp16 / bf16 "
                        "are refused with the reason)")
    p.add_argument("--attention-op", default="stock", choices=["stock", "fused"],
                   help="fused: each layer's attention over the cache as one node of paddle-vha's onnxruntime op "
                        "library (ops/ort; shipped beside the graph: paddle_vha.serve and onnxruntime-genai load it, "
                        "stock onnxruntime with register_custom_ops_library; docs/deploy.md)")
    return p


QUANTIZED = Effect("with --weights int8 / int4", lambda a: a.weights in ("int8", "int4"))
GATED = Effect("with a quality gate: --weights int8 / int4 or --kv-cache int8 (it replaces the bound of each gate that "
               "runs)", lambda a: a.weights in ("int8", "int4") or a.kv_cache == "int8")
TAKES_EFFECT = {
    "folded_dir": ALWAYS, "out_dir": ALWAYS, "--opset": ALWAYS, "--decode-steps": ALWAYS, "--tolerance": ALWAYS,
    "--force": PERMISSION, "--cache": ALWAYS, "--weights": ALWAYS,
    "--external-data": Effect("always (over 2 GB the weights are external data anyway)"),
    "--block-size": QUANTIZED, "--float-lm-head": QUANTIZED, "--max-kl": GATED, "--min-agreement": GATED,
    "--kv-cache": ALWAYS, "--attention-op": ALWAYS, "--quant-recipe": QUANTIZED, "--float-embedding": QUANTIZED,
    "--mixed": Effect("with --weights int4", lambda a: a.weights == "int4"),
    "--calibration-text": QUANTIZED,
    "--paddle-program": Effect("with --weights int8 / int4 (an fp32 export always keeps paddle/)",
                               lambda a: a.weights in ("int8", "int4")),
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


def _check_text_file(path: str) -> None:
    """--calibration-text refused up front (ExportError, one line) when it is not a readable, non-empty UTF-8 text
    file; its length in tokens is checked when the model's tokenizer reads it."""
    import os

    from paddle_vha.export.errors import ExportError

    if os.path.isdir(path):
        raise ExportError(f"--calibration-text {path}: a folder, not a text file")
    if not os.path.isfile(path):
        raise ExportError(f"--calibration-text {path}: no such file")
    try:
        with open(path, "rb") as f:
            head = f.read(1 << 20)
    except OSError as e:
        raise ExportError(f"--calibration-text {path}: cannot read it ({e.strerror or e})") from None
    if not head.strip():
        raise ExportError(f"--calibration-text {path}: no text in it (empty, or only whitespace)")
    if b"\0" in head:
        raise ExportError(f"--calibration-text {path}: a binary file (it holds NUL bytes), not text")
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as e:
        if e.start < len(head) - 4:  # not just a character cut at the 1 MB mark
            raise ExportError(f"--calibration-text {path}: not UTF-8 text (byte {e.start})") from None


@command
def main(argv=None):
    p = build_parser()
    args, _ = parse_checked(p, argv, TAKES_EFFECT, _check_ranges)
    from paddle_vha.export.errors import ExportError
    from paddle_vha.export.kv_cache import check_kv_cache
    from paddle_vha.export.quality import gate_bounds
    from paddle_vha.export.quantize import check_weights

    from paddle_vha.export.quant_plan import RuleError, parse_rule
    from paddle_vha.export.quantize import default_spec

    spec = None
    try:  # before Paddle is even imported: a refused format, block size, rule or text file costs nothing
        check_weights(args.weights, args.block_size)
        check_kv_cache(args.kv_cache)
        from paddle_vha.export.fused_attention import attention_op_refusal

        if args.attention_op == "fused" and attention_op_refusal(args.cache):
            raise ExportError(attention_op_refusal(args.cache))
        if args.weights in ("int8", "int4"):
            mixed = None if args.mixed is None else tuple(x for x in args.mixed.split(",") if x.strip() != "none")
            parse_rule(mixed or ())
            spec = default_spec(args.weights, args.block_size, args.quant_recipe, mixed,
                                quantize_embedding=not args.float_embedding, quantize_lm_head=not args.float_lm_head)
        if args.calibration_text is not None:
            _check_text_file(args.calibration_text)
    except (ExportError, RuleError) as e:
        fail(str(e))
    from paddle_vha.export.kv_quality import CACHE_BOUNDS

    bounds = gate_bounds(args.weights, args.max_kl, args.min_agreement) if args.weights in ("int8", "int4") else None
    kv_bounds = (gate_bounds(args.kv_cache, args.max_kl, args.min_agreement, CACHE_BOUNDS)
                 if args.kv_cache in CACHE_BOUNDS else None)
    quiet()
    from paddle_vha.checkpoint.contract import CheckpointError
    from paddle_vha.export.onnx_export import export_onnx

    try:
        export_onnx(args.folded_dir, args.out_dir, opset=args.opset, decode_steps=args.decode_steps,
                    tolerance=args.tolerance, force=args.force, cache_io=args.cache,
                    external_data=args.external_data or None, weights=spec or args.weights,
                    quality_bounds=bounds, kv_cache=args.kv_cache, kv_quality_bounds=kv_bounds,
                    calibration_text=args.calibration_text, paddle_program=args.paddle_program or None,
                    attention_op=args.attention_op)
    except (CheckpointError, ExportError) as e:
        fail(str(e))
    print(f"wrote {args.out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
