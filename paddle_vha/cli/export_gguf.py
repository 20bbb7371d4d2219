"""Export a stock Llama / Qwen2 / Qwen3 checkpoint (a fold, an import) to one GGUF file for llama.cpp, by llama.cpp's own
converter and quantizer.

Runs llama.cpp's Hugging Face -> GGUF converter (convert_hf_to_gguf.py, vendored by llama-cpp-python) and, for q4_0 /
q4_k_m, its quantizer (llama_cpp.llama_model_quantize) on the converter's F32 file, in the side environment of
tools/llama_env.sh (built the first time: ~20 min of compiling on 2 cores). Paths are taken as given, relative to the
current folder; OUT.gguf is written through a temporary folder beside it and appears only when complete, never inside
FOLDED. The tokenizer is checked first (the converter with --vocab-only, seconds): llama.cpp's converter refuses a BPE
tokenizer whose pre-tokenizer it does not know, and the command says what to do. Then a smoke check: llama.cpp's
greedy tokens on the new file next to the checkpoint's own Paddle model's, for the same prompt ids.

    bash tools/env.sh python tools/export_gguf.py runs/folded runs/folded-q4_k_m.gguf --type q4_k_m
    bash tools/env.sh python tools/export_gguf.py runs/smollm2 smollm2-f32.gguf --type f32 --prompt "The capital of"

--type: f32, f16, bf16 and q8_0 come from the converter; q4_0 and q4_k_m from llama.cpp's quantizer on the F32 file
(q4_k_m keeps some tensors at Q6_K, as llama.cpp's recipe says). A folder llama.cpp does not run (Qwen3-VHA, MEA, ...)
is refused in one line saying where it goes instead.
Exit status: 0 written (the smoke check prints; a greedy difference on a quantized file is expected and not an
error), 1 a llama.cpp tool failed (nothing written), 2 refused (one line on stderr says why).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

from paddle_vha.cli import command, fail, quiet
from paddle_vha.cli.options import ALWAYS, PERMISSION, Effect, parse_checked

DEFAULT_PROMPT = "The capital of France is"


def build_parser() -> argparse.ArgumentParser:
    from paddle_vha.export.gguf import GGUF_TYPES

    doc = __doc__
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=doc.split("\n\n", 1)[1])
    p.add_argument("folded", metavar="FOLDED", help="checkpoint folder: stock llama / qwen2 / qwen3 (config.json + "
                                                    "safetensors + tokenizer.json)")
    p.add_argument("out", metavar="OUT.gguf", help="the GGUF file to write (must not exist, not inside FOLDED)")
    p.add_argument("--type", required=True, choices=list(GGUF_TYPES), help="weight type of the GGUF file")
    p.add_argument("--force", action="store_true", help="replace an existing OUT.gguf (once the new one is complete)")
    p.add_argument("--dry-run", action="store_true", help="check the folder, OUT and the tokenizer; write nothing")
    p.add_argument("--no-check", action="store_true", help="skip the smoke check (llama.cpp's greedy tokens vs the "
                                                           "Paddle model's)")
    p.add_argument("--prompt", default=DEFAULT_PROMPT, help=f"smoke-check prompt (default {DEFAULT_PROMPT!r})")
    p.add_argument("--new", type=int, default=8, help="greedy tokens of the smoke check (default 8)")
    p.add_argument("--llama-python", default=None, metavar="PY", help="python of an existing llama.cpp side "
                   "environment (with --llama-src; default: the checkout's tools/llama_env.sh)")
    p.add_argument("--llama-src", default=None, metavar="DIR", help="llama-cpp-python's unpacked sdist (holds "
                   "vendor/llama.cpp/convert_hf_to_gguf.py)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


_SMOKE = Effect("with the smoke check (not with --no-check or --dry-run)", lambda a: not (a.no_check or a.dry_run))
TAKES_EFFECT = {"FOLDED": ALWAYS, "OUT.gguf": ALWAYS, "--type": ALWAYS, "--force": PERMISSION, "--dry-run": ALWAYS,
                "--no-check": Effect("when it writes (not with --dry-run, which runs no check)",
                                     lambda a: not a.dry_run),
                "--prompt": _SMOKE, "--new": _SMOKE, "--llama-python": ALWAYS, "--llama-src": ALWAYS,
                "--no-progress": Effect("always (with --dry-run there is no bar to hide: what it asks holds)")}


def _check_ranges(p, args) -> None:
    if args.new < 1:
        p.error("--new must be >= 1")


def parse_args(argv=None):
    args, _ = parse_checked(build_parser(), argv, TAKES_EFFECT, _check_ranges)
    return args


def _smoke(args, side, plan, path, scratch) -> None:
    """llama.cpp's greedy tokens on the new file next to the Paddle model's, for the prompt as the folder's
    tokenizer.json encodes it."""
    from paddle_vha.checkpoint.contract import CheckpointError
    from paddle_vha.export.gguf import llama_greedy, paddle_greedy
    from paddle_vha.serve.text import load_codec

    codec = load_codec(plan.folder.path, int(plan.folder.config.get("vocab_size", 0)))
    if codec is None:
        print("smoke check: skipped (no tokenizer.json in FOLDED)")
        return
    ids = codec.encode(args.prompt)
    got = llama_greedy(side, path, args.prompt, ids, args.new, scratch, name=args.out)
    try:
        ours = paddle_greedy(plan.folder.path, ids, args.new)
    except CheckpointError as e:
        ours = None
        print(f"smoke check: no Paddle model to compare with ({e})")
    if got["tokenized"] != ids:
        print(f"note: llama.cpp tokenizes the prompt as {got['tokenized']}, tokenizer.json as {ids}")
    print(f"smoke check, prompt {args.prompt!r} = {ids}:")
    label = f"llama.cpp ({args.type}):"
    print(f"  {label:<20} {got['greedy']}  {codec.decode(got['greedy'])!r}")
    if ours is not None:
        same = next((i for i, (a, b) in enumerate(zip(got["greedy"], ours)) if a != b), None)
        print(f"  {'Paddle (float32):':<20} {ours}  {codec.decode(ours)!r}")
        print("  -> the same greedy tokens" if same is None else
              f"  -> they differ from token {same} on" + (" (expected of a quantized file)" if plan.quantize or
                                                            args.type == "q8_0" else ""))


@command
def main(argv=None) -> int:
    args = parse_args(argv)
    quiet()
    from paddle_vha.checkpoint.contract import CheckpointError
    from paddle_vha.checkpoint.fsutil import atomic_file, scratch_dir
    from paddle_vha.export.gguf import GGUFExportError, check_tokenizer, find_side, plan_gguf_export, write_gguf
    from paddle_vha.units import fmt_bytes

    try:
        plan = plan_gguf_export(args.folded, args.out, args.type, args.force)
        print(f"export_gguf {args.folded} -> {args.out}: {plan.label}, {len(plan.folder.tensors)} tensors, --type "
              f"{args.type} (" + (f"llama.cpp's converter F32, then its quantizer {plan.quantize})" if plan.quantize
                                  else f"llama.cpp's converter --outtype {plan.outtype})"))
        side = find_side(args.llama_python, args.llama_src)
        with scratch_dir("vha-gguf-") as scratch:
            t0 = time.perf_counter()
            pre = check_tokenizer(side, plan, scratch)
            print(f"tokenizer: llama.cpp's converter takes it ({pre}; {time.perf_counter() - t0:.1f} s)")
            if args.dry_run:
                print("dry run: nothing written")
                return 0
            t0 = time.perf_counter()
            with atomic_file(args.out, tool="paddle-vha-export-gguf", replace=args.force,
                             error=GGUFExportError) as path:
                write_gguf(side, plan, path, scratch, progress=not args.no_progress)
                seconds = time.perf_counter() - t0
                if not args.no_check:  # on the temporary file: a file llama.cpp cannot run is never put in place
                    _smoke(args, side, plan, path, scratch)
            print(f"wrote {args.out}: {fmt_bytes(os.path.getsize(args.out))} in {seconds:.1f} s"
                  + ("" if args.no_check else " (smoke check above)"))
    except CheckpointError as e:
        tool_failed = isinstance(e, GGUFExportError) and ("failed (exit" in str(e) or "could not run" in str(e))
        fail(str(e), 1 if tool_failed else 2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
