"""Shrink a model's KV cache in one command: convert it to VHA with fewer KV heads, heal it on its own words with a
stored teacher, fold it back into a stock checkpoint, export it, and print the before / after table.

    ORIGINAL --[convert_to_vha: --kv-heads, the best start, --refine-steps]--> OUT/converted
             --[make_heal_data: its own chat answers (+ --text continuations)]--> OUT/data/heal
             --[store_teacher: top-64 of the original on every window]--> OUT/data/teacher
             --[train: stored-teacher KD, --tokens]--> OUT/heal/model
             --[fold]--> OUT/model (a stock checkpoint with --kv-heads KV heads)
             --[export_onnx --weights --export]--> OUT/export
             --> OUT/report.md / report.json: original, converted (step 0), healed

Each stage is one of the project's tools run as its own process (their options, their refusals, their progress); a
finished stage is recorded in OUT/stages.json and skipped when the command is run again, and the long ones resume
where they stopped (the data journal, the store's windows, the Trainer's checkpoints), so an interrupted run goes on
when the same command is given again. The table (paddle_vha/train/heal_report.py): perplexity and KL to the original
on held-out windows of the healing data (the training run's validation windows), teacher-forced agreement and KL on
the original's greedy answers to 16 probe prompts the data never holds, identical answers, the answer to "What is the
capital of France?", and KV bytes per token.

    python tools/shrink_kv.py runs/smollm2 runs/smol-1kv --kv-heads 1                        # hours on 2 cores
    python tools/shrink_kv.py runs/smollm2 runs/smol-1kv --kv-heads 1 --tokens 65536 --chat-tokens 80000 --export none
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from paddle_vha.cli import command, fail, quiet
from paddle_vha.cli.options import ALWAYS, Effect, parse_checked

STAGES = ("convert", "data", "teacher", "heal", "fold", "export", "report")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("original", metavar="ORIGINAL", help="a stock checkpoint folder with its tokenizer and chat template")
    p.add_argument("out", metavar="OUT", help="the work folder (created; a second run resumes it)")
    p.add_argument("--kv-heads", type=int, required=True, help="KV heads of the result")
    p.add_argument("--method", choices=("best", "mean", "svd", "calibrated"), default="best",
                   help="conversion: the start (default best: the lowest KL measured)")
    p.add_argument("--refine-steps", type=int, default=30, help="conversion: refinement steps per layer (default 30)")
    p.add_argument("--original-export", metavar="DIR", help="an ONNX export of ORIGINAL (float32) to sample the data "
                   "and run the teacher with (default: made once in OUT/data/heal.export)")
    p.add_argument("--calib-data", metavar="FILE", help="conversion: text to calibrate on (default: the converter's)")
    p.add_argument("--chat-tokens", type=int, default=262_144, help="healing data: chat tokens (default 262,144)")
    p.add_argument("--max-new", type=int, default=256, help="healing data: answer tokens at most (default 256)")
    p.add_argument("--text", nargs="+", default=[], metavar="FILE", help="healing data: text files to continue")
    p.add_argument("--text-tokens", type=int, default=None, help="healing data: continuation tokens (default "
                   "131,072 with --text)")
    p.add_argument("--tokens", type=int, default=262_144, help="healing: training tokens (default 262,144)")
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--lr", type=float, default=2e-4, help="healing: learning rate, constant after 4 warm-up steps")
    p.add_argument("--freeze-embeddings", action="store_true", help="healing: leave the embedding table as it is")
    p.add_argument("--export", choices=("int4", "int8", "fp32", "none"), default="int4",
                   help="the folded model's ONNX export (default int4)")
    p.add_argument("--threads", type=int, default=0, help="onnxruntime threads of the data and teacher stages")
    p.add_argument("--seed", type=int, default=0)
    return p


TAKES_EFFECT = {k: ALWAYS for k in ("ORIGINAL", "OUT", "--kv-heads", "--refine-steps", "--chat-tokens", "--tokens",
                                    "--seq-len", "--batch", "--lr", "--freeze-embeddings", "--export", "--threads",
                                    "--seed", "--calib-data", "--method", "--original-export", "--max-new")}
TAKES_EFFECT.update({"--text": Effect("with --text-tokens > 0", lambda a: a.text_tokens != 0),
                     "--text-tokens": ALWAYS})


def _check(p, args) -> None:
    if args.text_tokens is None:
        args.text_tokens = 131_072 if args.text else 0
    if not os.path.isdir(args.original):
        p.error(f"{args.original}: no such folder")
    for name in ("kv_heads", "tokens", "seq_len", "batch", "max_new"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} {getattr(args, name)}: must be >= 1")
    if args.tokens < args.batch * args.seq_len:
        p.error(f"--tokens {args.tokens}: less than one step of --batch x --seq-len = {args.batch * args.seq_len}")
    if not (args.lr > 0):
        p.error(f"--lr {args.lr}: must be > 0")
    for f in args.text + ([args.calib_data] if args.calib_data else []):
        if not os.path.isfile(f):
            p.error(f"{f}: no such file")
    if args.original_export and not os.path.isfile(os.path.join(args.original_export, "export_info.json")):
        p.error(f"--original-export {args.original_export}: not an export folder (no export_info.json)")
    if os.path.exists(args.out) and not os.path.isdir(args.out):
        p.error(f"OUT {args.out}: exists and is not a folder")


class Stages:
    """OUT/stages.json: the finished stages with the settings they ran with."""

    def __init__(self, out: str, settings: dict):
        self.path = os.path.join(out, "stages.json")
        self.done = {}
        if os.path.isfile(self.path):
            with open(self.path, encoding="utf-8") as f:
                rec = json.load(f)
            if rec.get("settings") != settings:
                changed = sorted(k for k in set(settings) | set(rec.get("settings", {}))
                                 if settings.get(k) != rec.get("settings", {}).get(k))
                fail(f"{out} was started with other settings ({', '.join(changed)} differ); give the same options to "
                     "resume it, or another OUT")
            self.done = rec.get("done", {})
        self.settings = settings

    def finish(self, stage: str, seconds: float) -> None:
        self.done[stage] = round(seconds, 1)
        tmp = self.path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump({"settings": self.settings, "done": self.done}, f, indent=1)
        os.replace(tmp, self.path)


def _tool(module: str, *argv) -> None:
    """python -m paddle_vha.cli.MODULE ARGV..., its output shown; one line and exit 2 when it fails."""
    cmd = [sys.executable, "-m", f"paddle_vha.cli.{module}", *[str(a) for a in argv]]
    r = subprocess.run(cmd)
    if r.returncode != 0:
        fail(f"stage {module} failed (exit {r.returncode}): {' '.join(cmd[2:])}; fix what it said and run this "
             "command again (finished stages are kept)")


def heal_config(args, model_type: str) -> dict:
    steps = args.tokens // (args.batch * args.seq_len)
    every = max(1, steps // 8)
    return {"model_type": model_type, "dataset": "pretrain", "max_seq_len": args.seq_len, "max_eval_samples": 16,
            "output_dir": os.path.join(args.out, "heal"), "device": "cpu", "seed": args.seed, "do_train": True,
            "do_eval": True, "max_steps": steps, "per_device_train_batch_size": args.batch,
            "per_device_eval_batch_size": args.batch, "learning_rate": args.lr,
            "lr_scheduler_type": "constant_with_warmup", "warmup_steps": min(4, steps), "weight_decay": 0.0,
            "max_grad_norm": 1.0, "logging_steps": max(1, min(8, every)), "evaluation_strategy": "steps",
            "eval_steps": every, "save_steps": every, "save_total_limit": 2, "report_to": "none", "disable_tqdm": True,
            "freeze_embeddings": bool(args.freeze_embeddings)}


def report(args, paths: dict) -> dict:
    """The before / after table (report.json, report.md), from the original, the converted start and the healed
    model."""
    quiet()
    import numpy as np

    from paddle_vha.accounting import arch_from_config, kv_bytes_per_token
    from paddle_vha.serve.text import generation_defaults, load_codec, render_chat
    from paddle_vha.train.heal_report import PROBES, Reference, measure
    from paddle_vha.train.stored_teacher import TeacherStore, stream_of

    from paddle_vha.families import load_float32_model as load

    original, ocfg = load(args.original)
    codec = load_codec(args.original, ocfg.vocab_size)
    eos = [int(e) for e in np.atleast_1d(generation_defaults(args.original)["eos"])]
    store = TeacherStore(paths["teacher"])
    S, n = store.seq_len, store.meta["windows"]
    stream = stream_of(store.data_prefix)
    n_val = min(16, max(1, n // 20))  # the training run's validation windows (run_data.stored_teacher_data)
    first = n - n_val
    windows = np.stack([stream[(first + i) * S:(first + i + 1) * S + 1] for i in range(min(n_val, 8))])
    prompts = [codec.encode(render_chat(args.original, [{"role": "user", "content": p}])) for p in PROBES]
    ref = Reference(original, windows, prompts, eos)
    rows = {}
    for name, folder in (("original", args.original), ("converted (step 0)", paths["converted"]),
                         ("healed", paths["model"])):
        model, cfg = load(folder) if folder != args.original else (original, ocfg)
        row = measure(model, ref, decode=lambda ids: codec.decode(ids))
        arch = arch_from_config({**cfg.to_dict(), "model_type": cfg.model_type}, label=name)
        row["kv_bytes_per_token"] = int(kv_bytes_per_token(arch, 2, all_layers=True))
        rows[name] = row
    stages = json.load(open(os.path.join(args.out, "stages.json"), encoding="utf-8"))["done"]
    data_meta = json.load(open(paths["data"] + ".json", encoding="utf-8"))
    out = dict(rows=rows, probes=PROBES, stage_seconds=stages, healing_tokens=args.tokens,
               data_tokens=data_meta["tokens"])
    lines = [f"# {args.original} -> {args.kv_heads} KV heads ({args.out})", "",
             f"Healed on {args.tokens:,} tokens of the model's own data ({data_meta['tokens']:,} written), stored-"
             "teacher distillation. Held-out: the healing data's validation windows and 16 probe prompts the data "
             "never holds.", "",
             "| model | KV bytes / token (16-bit) | perplexity | KL to the original | chat agreement | chat KL | "
             "identical answers | 'What is the capital of France?' |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for name, r in rows.items():
        ans = r["answers"][0].replace("|", "/").replace("\n", " ")[:80]
        lines.append(f"| {name} | {r['kv_bytes_per_token']:,} | {r['ppl']:.2f} | {r['kl']:.4f} | "
                     f"{r['chat_agreement']:.3f} | {r['chat_kl']:.4f} | {r['identical_answers']} / {len(PROBES)} | "
                     f"{ans} |")
    lines += ["", "Stage wall times (s): " + ", ".join(f"{k} {v}" for k, v in stages.items())]
    with open(os.path.join(args.out, "report.json"), "w", encoding="utf-8") as f:
        json.dump(out, f, indent=1)
    with open(os.path.join(args.out, "report.md"), "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    return out


@command
def main(argv=None):
    args, _ = parse_checked(build_parser(), argv, TAKES_EFFECT, _check)
    os.makedirs(args.out, exist_ok=True)
    settings = {k: v for k, v in vars(args).items() if k not in ("threads",)}
    settings["original"] = os.path.abspath(args.original)
    settings["out"] = os.path.abspath(args.out)
    stages = Stages(args.out, settings)
    from paddle_vha.train.heal_report import PROBES

    paths = dict(converted=os.path.join(args.out, "converted"), data=os.path.join(args.out, "data", "heal"),
                 teacher=os.path.join(args.out, "data", "teacher"), heal=os.path.join(args.out, "heal"),
                 model=os.path.join(args.out, "model"), export=os.path.join(args.out, "export"))
    exclude = os.path.join(args.out, "probes.txt")
    with open(exclude, "w", encoding="utf-8") as f:
        f.write("\n".join(PROBES) + "\n")
    threads = ["--threads", args.threads] if args.threads else []
    sampler = ["--export", args.original_export] if args.original_export else []
    for i, stage in enumerate(STAGES, 1):
        if stage in stages.done:
            print(f"[{i}/{len(STAGES)}] {stage}: done earlier ({stages.done[stage]} s)", file=sys.stderr)
            continue
        if stage == "export" and args.export == "none":
            stages.finish(stage, 0.0)
            continue
        print(f"[{i}/{len(STAGES)}] {stage}", file=sys.stderr, flush=True)
        t0 = time.time()
        if stage == "convert":
            calib = ["--calib-data", args.calib_data] if args.calib_data else []
            _tool("convert_to_vha", args.original, paths["converted"], "--kv-heads", args.kv_heads, "--premix", "off",
                  "--method", args.method, "--refine-steps", args.refine_steps, "--force", *calib)
        elif stage == "data":
            text = ["--text", *args.text, "--text-tokens", args.text_tokens] if args.text_tokens else \
                ["--text-tokens", 0]
            _tool("make_heal_data", args.original, "--out", paths["data"], "--chat-tokens", args.chat_tokens,
                  "--max-new", args.max_new,
                  "--exclude", exclude, "--seed", args.seed, *text, *threads, *sampler)
        elif stage == "teacher":
            _tool("store_teacher", args.original, paths["data"], "--out", paths["teacher"], "--seq-len", args.seq_len,
                  *threads, *sampler)
        elif stage == "heal":
            with open(os.path.join(paths["converted"], "config.json"), encoding="utf-8") as f:
                model_type = json.load(f)["model_type"]
            cfg_path = os.path.join(args.out, "heal_config.json")
            with open(cfg_path, "w", encoding="utf-8") as f:
                json.dump(heal_config(args, model_type), f, indent=1)
            _tool("train", cfg_path, "--model_name_or_path", paths["converted"], "--teacher", paths["teacher"])
        elif stage == "fold":
            _tool("fold", os.path.join(paths["heal"], "model"), paths["model"], "--force", "--verify")
        elif stage == "export":
            _tool("export_onnx", paths["model"], paths["export"], "--weights", args.export, "--force")
        elif stage == "report":
            stages.finish(stage, 0.0)  # the table reads the stage times, this one included
            t0 = time.time()
            report(args, paths)
        stages.finish(stage, time.time() - t0)
    print(f"done: {paths['model']} (stock checkpoint, {args.kv_heads} KV heads)"
          + (f", {paths['export']} ({args.export} ONNX)" if args.export != "none" else "")
          + f"; table in {os.path.join(args.out, 'report.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
