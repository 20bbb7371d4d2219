"""Import a GGUF file (llama.cpp's format: Llama, Qwen2, Qwen3) as a Hugging Face-layout safetensors checkpoint.

Reads GGUF's header (architecture, hyper-parameters, tokenizer, chat template) and writes OUT: config.json (Hugging
Face's LlamaConfig / Qwen2Config / Qwen3Config filled from the file), the weights in Hugging Face names and layout
(each tensor read, dequantized to float32 and written one at a time; Llama's q / k rows put back in Hugging Face's
order), tokenizer.json + tokenizer_config.json with the chat template (transformers' own GGUF tokenizer conversion),
generation_config.json (EOS ids: the file's EOS and the chat template's end-of-turn token) and gguf_import.json (where
the weights came from and at what precision). GGUF is never modified; OUT appears only when complete.

    bash tools/env.sh python tools/import_gguf.py model.gguf runs/imported --dry-run   # check + plan, no writes
    bash tools/env.sh python tools/import_gguf.py "$(bash tools/fetch_smollm2.sh)" runs/smollm2

Types read: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 and the K-quants Q2_K..Q6_K (dequantized by the `gguf`
package). A quantized file's weights come back on their quantization grid: the command says so, and int4 / int8
numbers measured on such a model afterwards are optimistic.
Memory: one tensor at a time (the largest, usually the embedding, dequantized: ~4 x its float32 bytes) + ~0.5 GB;
printed first, refused up front in one line when /proc/meminfo's MemAvailable is lower.
Exit status: 0 done, 2 refused (one line on stderr says why: not a GGUF file, a truncated one, an architecture or a
tensor type it does not read, a missing or mis-shaped tensor, OUT inside or equal to an input, ...).
"""
from __future__ import annotations

import argparse
import sys

from paddle_vha.cli import command, run_transform
from paddle_vha.cli.options import ALWAYS, PERMISSION, Effect, parse_checked

IMPORT_DTYPES = ("float32", "bfloat16", "float16")  # paddle_vha.transform.import_gguf.IMPORT_DTYPES (checked there)
BASE_BYTES = 512 << 20  # transformers' tokenizer and config classes imported, the header and the vocabulary read


def build_parser() -> argparse.ArgumentParser:
    doc = __doc__
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=doc.split("\n\n", 1)[1])
    p.add_argument("in_path", metavar="GGUF", help="the GGUF file (llama, qwen2 or qwen3 architecture)")
    p.add_argument("out_dir", metavar="OUT", help="where the checkpoint folder goes (must not exist)")
    p.add_argument("--dtype", default="float32", choices=IMPORT_DTYPES,
                   help="dtype of the written weights (default float32: what dequantization gives, exactly)")
    p.add_argument("--force", action="store_true", help="replace an existing OUT (only once the new one is complete)")
    p.add_argument("--dry-run", action="store_true", help="validate and print the plan; write nothing")
    p.add_argument("--max-shard-size", default="5GB", help="largest output shard, e.g. 5GB, 500MB (default 5GB)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


TAKES_EFFECT = {"GGUF": ALWAYS, "OUT": ALWAYS, "--dtype": ALWAYS, "--force": PERMISSION, "--dry-run": ALWAYS,
                "--max-shard-size": ALWAYS,
                "--no-progress": Effect("always (with --dry-run there is no bar to hide: what it asks holds)")}


def parse_args(argv=None):
    args, _ = parse_checked(build_parser(), argv, TAKES_EFFECT)
    return args


def _plan(args):
    from paddle_vha.transform.import_gguf import plan_import_gguf

    return plan_import_gguf(args.in_path, args.out_dir, dtype=args.dtype, force=args.force,
                            max_shard_size=args.max_shard_size)


def _write(args, plan):
    from paddle_vha.transform.import_gguf import import_gguf

    return import_gguf(plan, progress=not args.no_progress)


def _memory(args, plan):
    """(bytes, formula): the largest tensor's raw bytes, its float32 dequantization with gguf's intermediates, and the
    cast output (measured: docs/gguf.md), on top of the imports and the header."""
    from paddle_vha.transform import memory as mem

    largest = max(t.elements for t in plan.gguf.tensors.values())
    return mem.total({"base": BASE_BYTES, "largest tensor": 4 * 4 * largest})


def _done(args, plan, seconds: float, written) -> int:
    from paddle_vha.transform.import_gguf import summary_lines

    print(f"wrote {written}: {plan.bytes_out / 1e6:.3f} MB in {seconds:.2f} s")
    for line in summary_lines(plan):
        print(line)
    return 0


@command
def main(argv=None) -> int:
    return run_transform(parse_args(argv), _plan, _write, "checkpoint", _done, _memory)


if __name__ == "__main__":
    sys.exit(main())
