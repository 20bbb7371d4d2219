"""Export a folded (stock Qwen3) checkpoint to an ONNX decoder with KV cache, and validate it.

    python tools/export_onnx.py FOLDED_DIR OUT_DIR [--opset 17] [--decode-steps 16] [--force]

Goes through Paddle's own route (jit.save of a static program, then paddle2onnx) and checks the result as
Optimum does: onnx.checker full check, standard ONNX ops only, KV inputs with H_kv heads, and onnxruntime vs
Paddle logits for a prefill and greedy decode steps (fp32, max abs diff <= --tolerance). I/O follows the
onnxruntime-genai / Optimum convention: input_ids, attention_mask, position_ids, past_key_values.{i}.key/.value
[batch, H_kv, past, head_dim] -> logits, present.{i}.key/.value. OUT_DIR also gets the static Paddle program
(OUT_DIR/paddle/) for Paddle Inference. Nothing is written unless everything passes.

--cache buffer writes the in-place flavour instead (docs/deploy.md): the cache goes in as the runtime's buffers and
only the new positions come out (new.{i}.key/.value), so nothing copies the cache; paddle_vha.serve and
tools/generate.py run it, onnxruntime-genai and Optimum do not.
"""
from __future__ import annotations

import argparse
import sys


from paddle_vha.cli import command, fail, quiet


@command
def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("folded_dir", help="stock Qwen3 checkpoint folder (e.g. the output of tools/fold.py)")
    p.add_argument("out_dir", help="where to write model.onnx, paddle/ and export_info.json")
    p.add_argument("--opset", type=int, default=17, help="ONNX opset, >= 14 (default 17)")
    p.add_argument("--decode-steps", type=int, default=16, help="greedy decode steps checked (default 16)")
    p.add_argument("--tolerance", type=float, default=1e-4, help="max abs logit diff allowed (default 1e-4)")
    p.add_argument("--force", action="store_true", help="replace OUT_DIR if it exists")
    p.add_argument("--cache", default="concat", choices=["concat", "buffer"],
                   help="cache interface: concat (default; present = past + new, what onnxruntime-genai and Optimum "
                        "run) or buffer (the in-place flavour paddle_vha.serve runs: faster at long context)")
    args = p.parse_args(argv)
    if args.decode_steps < 1:
        p.error("--decode-steps must be >= 1")
    quiet()
    from paddle_vha.checkpoint.contract import CheckpointError
    from paddle_vha.export.onnx_export import ExportError, export_onnx

    try:
        export_onnx(args.folded_dir, args.out_dir, opset=args.opset, decode_steps=args.decode_steps,
                    tolerance=args.tolerance, force=args.force, cache_io=args.cache)
    except (CheckpointError, ExportError) as e:
        fail(str(e))
    print(f"wrote {args.out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
