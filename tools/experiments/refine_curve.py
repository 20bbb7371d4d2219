"""The refined start's budget, measured (issue 57 item 4; a section of docs/study/heal.md): SmolLM2-135M-Instruct
converted 3 -> 1 KV heads (tools/convert_to_vha.py --premix off --method calibrated), then layer-wise refinement
(--refine-steps N per layer on --refine-tokens T calibration tokens), for several N, T and calibration texts; each
start measured by the healing study's teacher-forced measures (tools/experiments/heal_eval.py: held-out Austen
perplexity and KL, agreement and KL on the original's answers to 50 held-out chat prompts) beside what it cost
(the conversion's wall time on this CPU, the refinement's FLOPs as the tool prints them).

Calibration texts: austen (runs/text/austen_train.txt, the real-model study's) and chat (the model's own healing
documents, decoded with their chat template: what the healed model will be asked to do).

Resumable: each start's row goes to WORK/rows.jsonl when measured; a start already converted is not converted again.

    nice python -m tools.experiments.refine_curve --grid 0:4096:austen 10:4096:austen 30:4096:austen 100:4096:austen
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time

from .heal_study import ROOT, Rows, log

TEXTS = ("austen", "chat")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--original", default="runs/smollm2")
    p.add_argument("--work", default="runs/heal/refine")
    p.add_argument("--austen-train", default="runs/text/austen_train.txt")
    p.add_argument("--chat-journal", default="runs/heal/smol.jsonl")
    p.add_argument("--held", default="runs/text/austen_held.txt")
    p.add_argument("--grid", nargs="+", default=["0:4096:austen", "10:4096:austen", "30:4096:austen"],
                   help="STEPS:TOKENS:TEXT per start")
    p.add_argument("--keep", nargs="*", default=[], help="starts (STEPS:TOKENS:TEXT) whose folder is kept")
    return p.parse_args(argv)


def calib_file(args, text: str) -> str:
    if text == "austen":
        return args.austen_train
    path = os.path.join(args.work, "chat.txt")
    if not os.path.isfile(path):
        from paddle_vha.serve.text import load_codec

        with open(os.path.join(args.original, "config.json"), encoding="utf-8") as f:
            codec = load_codec(args.original, int(json.load(f)["vocab_size"]))
        with open(args.chat_journal, encoding="utf-8") as f:
            docs = [codec.decode(d["ids"]) for d in map(json.loads, f) if "ids" in d]
        os.makedirs(args.work, exist_ok=True)
        with open(path + ".partial", "w", encoding="utf-8") as f:
            f.write("\n".join(docs))
        os.replace(path + ".partial", path)
    return path


def convert(args, steps: int, tokens: int, text: str, out: str) -> dict:
    cmd = [sys.executable, os.path.join(ROOT, "tools", "convert_to_vha.py"), args.original, out, "--kv-heads", "1",
           "--premix", "off", "--method", "calibrated", "--no-compare", "--calib-data", calib_file(args, text),
           "--refine-steps", str(steps), "--refine-tokens", str(tokens), "--force", "--no-progress"]
    log(" ".join(cmd[1:]))
    t0 = time.time()
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seconds = time.time() - t0
    if r.returncode != 0:
        sys.exit(f"convert_to_vha failed (exit {r.returncode}):\n{r.stdout[-3000:]}")
    flops = re.search(r"([0-9.]+)\s*(T|G|P)FLOP", r.stdout)
    kl = re.search(r"calibrated\s+KL\s+([0-9.eE+-]+)", r.stdout)
    return dict(convert_seconds=round(seconds, 1), tool_kl=float(kl.group(1)) if kl else None,
                refine_flops=flops.group(0) if flops else None, log_tail=r.stdout[-1500:])


def main(argv=None) -> int:
    args = parse_args(argv)
    from paddle_vha.cli import quiet

    quiet()
    rows = Rows(os.path.join(args.work, "rows.jsonl"))
    evaluator = None
    for spec in args.grid:
        steps, tokens, text = spec.split(":")
        steps, tokens = int(steps), int(tokens)
        assert text in TEXTS, f"{spec}: TEXT is one of {TEXTS}"
        if rows.find(steps=steps, refine_tokens=tokens, calib=text) is not None:
            continue
        out = os.path.join(args.work, f"start-{steps}-{tokens}-{text}")
        made = convert(args, steps, tokens, text, out)
        if evaluator is None:
            from .heal_eval import Evaluator

            evaluator = Evaluator(args.original, args.held)
        row = evaluator.evaluate(out, generate=False)
        row.update(made, steps=steps, refine_tokens=tokens, calib=text, folder=out)
        rows.add(row)
        log(f"start {spec}: {made['convert_seconds']:.0f} s; Austen ppl {row['ppl']:.2f} KL {row['kl']:.3f}; chat "
            f"agreement {row['chat_agreement']:.3f} KL {row['chat_kl']:.3f}")
        if spec not in args.keep:
            import shutil

            shutil.rmtree(out, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
