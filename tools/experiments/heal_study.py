"""Healing a converted chat model on its own words, measured (issue 57's study; writes docs/study/heal.md).

SmolLM2-135M-Instruct (3 KV heads) converted to 1 KV head (tools/convert_to_vha.py --premix off, the refined start:
calibrated, then layer-wise refinement), healed by the real Trainer (tools/train.py, configs/heal-smollm2.json's
settings: batch 4 x 256, AdamW 2e-4 constant after 4 warm-up steps) on three data sets, each with two losses:

    self     the model's own chat answers (tools/make_heal_data.py: prompts from the project's topic list and
             questions the model wrote itself, sampled at T = 0.7 / top-p 0.9, two per prompt)
    mix      self + the model's continuations of Austen training chapters (documents shuffled together)
    austen   the Austen training chapters themselves (docs/study/real_model.md's healing text)

    kd       1 CE + 1 KL to the stored teacher (tools/store_teacher.py: the original's top-64 per position)
    ce       cross-entropy alone, the same windows in the same order (the store read with its KL weight 0)

Every arm starts from the same converted checkpoint; the training windows of a seed are visited in the same order
at every budget (constant rate after warm-up: a shorter run is the prefix of a longer one), so one run evaluated at
each doubling of its tokens is the curve. At each doubling the teacher-forced measures (tools/experiments/
heal_eval.py: held-out Austen perplexity and KL, agreement and KL on the original's answers to 50 held-out chat
prompts); at an arm's last budget also its generated answers (identical answers, 60 checkable questions, Paris).

Resumable: each measured point goes to WORK/rows.jsonl at once, each training stage resumes from its checkpoint
(the Trainer's), so rerunning the same command continues where a killed one stopped; --report rewrites OUT.

    nice python -m tools.experiments.heal_study --arms self:kd self:ce mix:kd mix:ce austen:kd austen:ce
    nice python -m tools.experiments.heal_study --arms self:kd --seeds 1 --budget 32768
    python -m tools.experiments.heal_study --report-only
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Dict, List

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SETS = ("self", "mix", "austen")
LOSSES = ("kd", "ce")
TOKENS_PER_STEP = 4 * 256
FIRST_POINT = 8 * TOKENS_PER_STEP


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--original", default="runs/smollm2")
    p.add_argument("--start", default="runs/heal/start-refined", help="the converted checkpoint every arm heals")
    p.add_argument("--start-tag", default="", help="names the arms healed from a --start other than the study's")
    p.add_argument("--export", default="runs/bench-smol/fp32", help="the original's float32 ONNX export (teacher)")
    p.add_argument("--work", default="runs/heal/study")
    p.add_argument("--self-data", default="runs/heal/smol16", help="data prefix of the self set")
    p.add_argument("--mix-journals", nargs="+", default=["runs/heal/smol.jsonl", "runs/heal/text.jsonl"],
                   help="make_heal_data journals whose documents make the mix set")
    p.add_argument("--austen-train", default="runs/text/austen_train.txt")
    p.add_argument("--austen-tokens", type=int, default=75_520)
    p.add_argument("--held", default="runs/text/austen_held.txt")
    p.add_argument("--arms", nargs="+", default=["self:kd"], help="SET:LOSS, SET in self|mix|austen, LOSS kd|ce")
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--budget", type=int, default=32_768, help="training tokens of each arm (its last point)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default=os.path.join(ROOT, "docs", "study", "heal.md"))
    p.add_argument("--report-only", action="store_true")
    p.add_argument("--no-identical", action="store_true",
                   help="leave out the identical-answers count (half of an arm's last evaluation)")
    return p.parse_args(argv)


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def points(budget: int) -> List[int]:
    """The doublings of FIRST_POINT up to the budget, the budget included."""
    out, t = [], FIRST_POINT
    while t < budget:
        out.append(t)
        t *= 2
    return out + [budget]


class Rows:
    """WORK/rows.jsonl: one measured point per line, found again by its key."""

    def __init__(self, path: str):
        self.path, self.rows = path, []
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as f:
                self.rows = [json.loads(line) for line in f if line.strip()]

    def find(self, **key):
        for r in reversed(self.rows):  # the latest measure of a point
            if all(r.get(k) == v for k, v in key.items()):
                return r
        return None

    def add(self, row: dict) -> dict:
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")
        self.rows.append(row)
        return row


def run_tool(name: str, *args) -> float:
    t0 = time.time()
    cmd = [sys.executable, os.path.join(ROOT, "tools", f"{name}.py"), *map(str, args)]
    log(" ".join(cmd[1:]))
    r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        sys.exit(f"{name} failed (exit {r.returncode}):\n{r.stderr[-3000:]}")
    return time.time() - t0


# --- the data sets and their stored teachers ---------------------------------------------------------------------

def _write(prefix: str, docs, vocab: int) -> None:
    import contextlib
    import io

    from paddle_vha.train.datasets import write_pretrain_data

    tmp = prefix + ".partial"
    with contextlib.redirect_stdout(io.StringIO()):
        write_pretrain_data(tmp, docs, vocab_size=vocab)
    for ext in (".bin", ".idx"):
        os.replace(tmp + ext, prefix + ext)


def data_prefix(args, name: str) -> str:
    """The set's data prefix, written under WORK/data the first time (mix: the journals' documents shuffled with a
    fixed seed, so validation windows hold both kinds; austen: the first --austen-tokens tokens of the training
    chapters, in documents of 2,048)."""
    if name == "self":
        return args.self_data
    prefix = os.path.join(args.work, "data", name)
    if os.path.isfile(prefix + ".idx"):
        return prefix
    with open(os.path.join(args.original, "config.json"), encoding="utf-8") as f:
        vocab = int(json.load(f)["vocab_size"])
    if name == "mix":
        docs = []
        for path in args.mix_journals:
            with open(path, encoding="utf-8") as f:
                docs += [np.asarray(d["ids"], np.int64) for d in map(json.loads, f) if "ids" in d]
        order = np.random.default_rng(0).permutation(len(docs))
        _write(prefix, [docs[i] for i in order], vocab)
    else:
        from paddle_vha.serve.text import load_codec

        codec = load_codec(args.original, vocab)
        with open(args.austen_train, encoding="utf-8") as f:
            ids = np.asarray(codec.encode(f.read()[: args.austen_tokens * 8]), np.int64)[: args.austen_tokens]
        assert len(ids) == args.austen_tokens, f"{args.austen_train}: only {len(ids)} tokens"
        _write(prefix, [ids[a:a + 2048] for a in range(0, len(ids), 2048)], vocab)
    log(f"data set {name}: {prefix}")
    return prefix


def teacher_store(args, name: str) -> str:
    """WORK/teacher-NAME: the original's top-64 on the set's windows (resumes inside when interrupted)."""
    store = os.path.join(args.work, f"teacher-{name}")
    meta = os.path.join(store, "meta.json")
    if os.path.isfile(meta):
        with open(meta, encoding="utf-8") as f:
            m = json.load(f)
        if m.get("windows_done") == m.get("windows"):
            return store
    run_tool("store_teacher", args.original, data_prefix(args, name), "--out", store, "--seq-len", 256,
             "--export", args.export, "--threads", args.threads, "--no-progress")
    return store


# --- one arm -----------------------------------------------------------------------------------------------------

def train_config(args, out_dir: str, steps: int, seed: int) -> dict:
    with open(os.path.join(args.start, "config.json"), encoding="utf-8") as f:
        model_type = json.load(f)["model_type"]
    return {"model_type": model_type, "dataset": "pretrain", "max_seq_len": 256, "max_eval_samples": 16,
            "output_dir": out_dir, "device": "cpu", "seed": seed, "do_train": True, "do_eval": False,
            "max_steps": steps, "per_device_train_batch_size": 4, "learning_rate": 2e-4,
            "lr_scheduler_type": "constant_with_warmup", "warmup_steps": 4, "weight_decay": 0.0,
            "max_grad_norm": 1.0, "logging_steps": 4, "save_steps": steps, "save_total_limit": 1,
            "report_to": "none", "disable_tqdm": True}


def run_arm(args, rows: Rows, evaluator, name: str, loss: str, seed: int) -> None:
    arm = f"{name}:{loss}:s{seed}" + (f":{args.start_tag}" if args.start_tag else "")
    out_dir = os.path.join(args.work, "runs", arm.replace(":", "-"))
    store = teacher_store(args, name)
    todo = points(args.budget)
    for tokens in todo:
        last = tokens == todo[-1]
        have = rows.find(arm=arm, tokens=tokens)
        if have is not None and (have.get("qa_right") is not None or not last):
            continue
        steps = tokens // TOKENS_PER_STEP
        state = os.path.join(out_dir, f"checkpoint-{steps}")
        seconds = 0.0
        if not os.path.isdir(state):
            cfg = os.path.join(args.work, "configs", f"{arm.replace(':', '-')}-{steps}.json")
            os.makedirs(os.path.dirname(cfg), exist_ok=True)
            with open(cfg, "w", encoding="utf-8") as f:
                json.dump(train_config(args, out_dir, steps, seed), f, indent=1)
            extra = ["--distill_kl_weight", 0] if loss == "ce" else []
            seconds = run_tool("train", cfg, "--model_name_or_path", args.start, "--teacher", store, *extra)
        before = [r for r in rows.rows if r.get("arm") == arm and r["tokens"] < tokens]
        wall = (max(before, key=lambda r: r["tokens"])["train_wall_seconds"] if before else 0.0) + seconds
        log(f"{arm} at {tokens:,} tokens: measuring{' (with answers)' if last else ''}")
        row = evaluator.evaluate(os.path.join(state, "model"), generate=last)
        row.update(arm=arm, set=name, loss=loss, seed=seed, tokens=tokens, start=args.start, train_wall_seconds=round(wall, 1),
                   train_tokens_per_second=_tokens_per_second(out_dir))
        rows.add(row)
        log(f"{arm} {tokens:,}: ppl {row['ppl']:.2f}  KL {row['kl']:.3f}  chat agreement "
            f"{row['chat_agreement']:.3f}  chat KL {row['chat_kl']:.3f}"
            + (f"  questions {row['qa_right']}/{row['qa_items']}  Paris: {row['paris'][:60]!r}" if last else ""))


def _tokens_per_second(out_dir: str):
    path = os.path.join(out_dir, "train_log.jsonl")
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        v = [r["tokens_per_second"] for r in map(json.loads, f) if r.get("tokens_per_second")]
    return round(float(np.median(v)), 1) if v else None


# --- the report --------------------------------------------------------------------------------------------------

def report(args, rows: Rows) -> None:
    from .heal_study_report import write_report

    write_report(rows.rows, args.out, budget=args.budget)
    log(f"wrote {args.out}")


def main(argv=None) -> int:
    args = parse_args(argv)
    from paddle_vha.cli import quiet

    quiet()
    rows = Rows(os.path.join(args.work, "rows.jsonl"))
    if not args.report_only:
        arms = []
        for a in args.arms:
            name, _, loss = a.partition(":")
            if name not in SETS or loss not in LOSSES:
                sys.exit(f"--arms {a}: SET:LOSS with SET one of {SETS} and LOSS one of {LOSSES}")
            arms.append((name, loss))
        for name, _ in arms:  # every set's teacher first: the data and the store do not depend on the arm
            teacher_store(args, name)
        from .heal_eval import Evaluator

        log("measuring the original (its answers are the reference)")
        evaluator = Evaluator(args.original, args.held, identical=not args.no_identical)
        if rows.find(arm="original") is None:
            rows.add(dict(evaluator.original_row, arm="original", tokens=0, eval_seconds=round(evaluator.seconds, 1)))
        start = "start" + (f":{args.start_tag}" if args.start_tag else "")
        if rows.find(arm=start) is None:
            log(f"measuring the converted start {args.start}")
            rows.add(dict(evaluator.evaluate(args.start), arm=start, tokens=0, folder=args.start))
        for seed in args.seeds:
            for name, loss in arms:
                run_arm(args, rows, evaluator, name, loss, seed)
    report(args, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
