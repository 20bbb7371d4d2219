#!/usr/bin/env python
"""What the int8 KV cache costs in quality at long contexts: one checkpoint exported twice (the float32 cache and
--kv-cache int8, the same weights and flavour), both run over held-out text of each --positions length, logits
compared position by position.

    python tools/bench_kv_quality.py CHECKPOINT WORK [--positions 512 2048 4096] [--cache buffer] [--weights fp32]
    python tools/bench_kv_quality.py CHECKPOINT WORK --sharpen 8 2 --positions 2048   # a random-weight fixture

WORK (created) receives the two exports (tools/export_onnx.py's code; reused when present: WORK/<weights>-fp32cache,
WORK/<weights>-int8cache). The text is the held-out split of the embedded standard-library corpus as the checkpoint's
own token ids (its tokenizer.json, or bytes), read the way serving reads a long prompt and then generates: --chunk
tokens prefilled, every later chunk through the cache of all before it, the last --steps one decode step each
(paddle_vha/export/kv_quality.py). Printed per length: mean and max KL(float32 cache || int8 cache) in nats, greedy
agreement on the decisive positions (the float32 cache's top token ahead by >= 0.5 nats) and on all, and the max abs
logit difference, over the positions after the first chunk.

For a real checkpoint (e.g. SmolLM2-135M folded, once its base is served), run it as it is. A random-weight fixture
(tools/fixtures/qwen3_shaped.py) has flat logits and diffuse attention, which hide a cache's errors: --sharpen F A
first writes a copy of the checkpoint (WORK/sharpened) whose final norm weight is multiplied by F (peaked logits) and
whose q_norm / k_norm weights by A (attention logits x A^2), as tests/test_export_kv_cache.py does.

Memory: the two sessions side by side (each about the float32 weights, or the quantized weights), plus per chunk two
(batch x chunk x vocabulary) float32 logit blocks and their float64 log-softmax (Qwen3 vocabulary, chunk 256: ~1 GB).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

from paddle_vha.machine import cpu_line


def sharpened(src: str, work: str, final_norm: float, qk_norm: float, log) -> str:
    """WORK/sharpened: `src` with its final norm weight x final_norm and its q_norm / k_norm weights x qk_norm (the
    other tensors copied as they are), float32 safetensors; reused when present."""
    import shutil

    import numpy as np
    from safetensors.numpy import load_file, save_file

    out = os.path.join(work, "sharpened")
    if os.path.isfile(os.path.join(out, "config.json")):
        return out
    tmp = out + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    for name in os.listdir(src):
        path = os.path.join(src, name)
        if name.endswith(".safetensors"):
            tensors = {k: v.astype(np.float32) for k, v in load_file(path).items()}
            for k in tensors:
                if k == "model.norm.weight":
                    tensors[k] = tensors[k] * final_norm
                elif k.endswith(("q_norm.weight", "k_norm.weight")):
                    tensors[k] = tensors[k] * qk_norm
            save_file(tensors, os.path.join(tmp, name), metadata={"format": "pt"})
        elif os.path.isfile(path):
            shutil.copy2(path, tmp)
    cfg_path = os.path.join(tmp, "config.json")
    cfg = json.load(open(cfg_path))
    cfg["torch_dtype"] = "float32"
    json.dump(cfg, open(cfg_path, "w"), indent=2)
    os.rename(tmp, out)
    log(f"wrote {out}: final norm x {final_norm:g}, q_norm / k_norm x {qk_norm:g}")
    return out


def export(ckpt: str, out: str, cache: str, weights: str, kv_cache: str, log) -> str:
    from paddle_vha.export.onnx_export import export_onnx

    if not os.path.isfile(os.path.join(out, "export_info.json")):
        t = time.time()
        export_onnx(ckpt, out, cache_io=cache, weights=weights, kv_cache=kv_cache, decode_steps=2, force=True,
                    log=lambda m: log("  " + m))
        log(f"exported {out} in {time.time() - t:.0f} s")
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint", help="a servable (stock Qwen3 / folded) checkpoint folder")
    p.add_argument("work", help="folder for the exports (reused when present)")
    p.add_argument("--positions", type=int, nargs="+", default=[512, 2048], help="context lengths (default 512 2048)")
    p.add_argument("--chunk", type=int, default=256, help="prefill chunk (default 256)")
    p.add_argument("--steps", type=int, default=16, help="single decode steps at the end (default 16)")
    p.add_argument("--batch", type=int, default=1, help="held-out windows per length (default 1)")
    p.add_argument("--cache", default="buffer", choices=["concat", "buffer"])
    p.add_argument("--weights", default="fp32", choices=["fp32", "int8", "int4"])
    p.add_argument("--sharpen", type=float, nargs=2, metavar=("FINAL_NORM", "QK_NORM"),
                   help="multiply the final norm / q_norm and k_norm weights first (random-weight fixtures)")
    args = p.parse_args(argv)
    if min(args.positions) <= args.chunk + args.steps or args.chunk < 1 or args.steps < 0 or args.batch < 1:
        p.error("every --positions must exceed --chunk + --steps; --chunk, --batch >= 1, --steps >= 0")
    from paddle_vha.cli import quiet

    quiet()
    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    from paddle_vha.checkpoint.contract import CheckpointError
    from paddle_vha.export.errors import ExportError
    from paddle_vha.export.kv_quality import compare_exports

    try:
        os.makedirs(args.work, exist_ok=True)
        ckpt = sharpened(args.checkpoint, args.work, *args.sharpen, log) if args.sharpen else args.checkpoint
        ref = export(ckpt, os.path.join(args.work, f"{args.weights}-fp32cache"), args.cache, args.weights, "fp32", log)
        q = export(ckpt, os.path.join(args.work, f"{args.weights}-int8cache"), args.cache, args.weights, "int8", log)
        rows = []
        for n in args.positions:
            t = time.time()
            quality = compare_exports(ref, q, n, args.chunk, args.steps, args.batch)
            log(f"{n} positions: {time.time() - t:.0f} s")
            rows.append((n, quality))
    except (CheckpointError, ExportError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"\n{cpu_line()}; {args.checkpoint}{' sharpened %g %g' % tuple(args.sharpen) if args.sharpen else ''}; "
          f"{args.weights} weights, {args.cache} flavour; int8 cache vs float32 cache; {rows[0][1].text}")
    hdr = (f"{'positions':>9} | {'counted':>7} | {'mean KL':>9} | {'max KL':>9} | {'agree (decisive)':>16} | "
           f"{'agree (all)':>11} | {'max abs':>7}")
    print(hdr)
    print("-" * len(hdr))
    for n, qy in rows:
        print(f"{n:>9} | {qy.positions:>7} | {qy.mean_kl:>9.2e} | {qy.max_kl:>9.2e} | "
              f"{100 * qy.agreement:>6.1f}% of {qy.decisive:<5} | {100 * qy.agreement_all:>10.1f}% | "
              f"{qy.max_abs:>7.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
