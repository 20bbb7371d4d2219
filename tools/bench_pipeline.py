#!/usr/bin/env python
"""Every tool of the pipeline at the sizes users bring: wall time and peak RSS per step, then decode speed.

    python tools/bench_pipeline.py --shape 0.6b --work /data/bench            # Qwen3-0.6B widths, 28 layers, bf16
    python tools/bench_pipeline.py --shape 1.7b --work /data/bench --steps fixture,convert,fold
    python tools/bench_pipeline.py --shape 0.6b --layers 2 --work /tmp/b      # a quick run of the same path

Each step is the product command a user types (tools/*.py), run in its own process; its peak RSS is the process's
maximum resident set, its children included (os.wait4). The steps, on a random-weight Qwen3 written as a hub download
is (tools/fixtures/qwen3_shaped.py: sharded bf16 safetensors, a BPE tokenizer, generation_config.json):

    fixture    the stock Qwen3 checkpoint (bf16)
    convert    tools/convert_to_vha.py --kv-heads 2 (one row per --methods entry; --no-compare)
    fold       tools/fold.py of the converted Qwen3-VHA (a stock GQA-2 Qwen3)
    compress   tools/compress_kv.py --kv-heads 2 of the stock checkpoint (Qwen3-MEA)
    export     tools/export_onnx.py of the fold, --cache concat and --cache buffer
    generate   tools/generate.py on the concat export, 64 new tokens
    paddle     the same with --runtime paddle (Paddle Inference on the export's model.pdiparams)
    import     tools/import_fleet.py --verify of a research-fork Qwen3-VHA at the shape (tools/fixtures/fork_shaped.py)
    merge      tools/merge_tp_checkpoint.py of the converted checkpoint cut into a 2-way sharded save
               (tools/fixtures/tp_split.py)
    train      tools/train.py, 2 AdamW steps of batch 1 x 128 from the converted checkpoint, on pretraining data
               tokenized with the checkpoint's tokenizer (tools/make_pretrain_data.py), a checkpoint at step 2; it
               refuses up front where the machine lacks the memory it states (a row with rc 2)
    decode     batch 1, a 128-token prompt, 64 new tokens (greedy), in one run, one process each, same threads:
               paddle-vha's onnxruntime session on the export, Hugging Face transformers (torch, fp32) on the fold,
               onnxruntime-genai on the export (the last two in the side environment, tools/hf_env.sh)

Not a test: numbers depend on the machine; docs/results.md quotes them with the CPU model. Prints a Markdown table
and, with --json, writes the rows. The work folder keeps what the steps wrote (delete it after).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import textwrap
import time

from paddle_vha.machine import cpu_line

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = ("fixture", "convert", "fold", "compress", "export", "generate", "paddle", "import", "merge", "train", "decode")
# steps whose command makes an input for the next one (not a product command): reused when their output exists
INPUTS = ("fixture", "fork fixture", "tp split", "pretrain data")
PROMPT_LEN, NEW_TOKENS = 128, 64


def run_measured(cmd, log, env=None):
    """(wall seconds, peak RSS in MB of the process and its waited-for children, rc, output tail) of `cmd`."""
    shown = [("<script>" if i and cmd[i - 1] == "-c" else c[:60] + "..." if len(c) > 80 else c)
             for i, c in enumerate(cmd)]
    log("$ " + " ".join(shlex.quote(c) for c in shown))
    t0 = time.perf_counter()
    with tempfile.TemporaryFile("w+") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, env=env, text=True)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - t0
        out.seek(0)
        tail = out.read()[-3000:]
    return wall, usage.ru_maxrss / 1024, proc.returncode, tail


def tool(name: str) -> list:
    return [sys.executable, os.path.join(ROOT, "tools", name + ".py")]


def pipeline_steps(args, w):
    """(step label, command) in order; w(name) is a path inside the work folder."""
    fixture = [sys.executable, os.path.join(ROOT, "tools", "fixtures", "qwen3_shaped.py"), w("src"), "--shape",
               args.shape, "--dtype", "bfloat16"] + (["--layers", str(args.layers)] if args.layers else [])
    steps = [("fixture", "fixture", fixture)]
    for m in args.methods:
        steps.append(("convert", f"convert --method {m}", tool("convert_to_vha") + [
            w("src"), w(f"vha-{m}"), "--kv-heads", "2", "--method", m, "--no-compare", "--no-progress"]))
    first = args.methods[0]
    steps += [("fold", f"fold (of --method {first})", tool("fold") + [w(f"vha-{first}"), w("folded"), "--no-progress"]),
              ("compress", "compress_kv --kv-heads 2", tool("compress_kv") + [w("src"), w("mea"), "--kv-heads", "2",
                                                                             "--no-progress"]),
              ("export", "export --cache concat", tool("export_onnx") + [w("folded"), w("onnx")]),
              ("export", "export --cache buffer", tool("export_onnx") + [w("folded"), w("onnx-buffer"), "--cache",
                                                                          "buffer"]),
              ("generate", "generate (64 new tokens)", tool("generate") + [
                  w("onnx"), "--prompt", "def fibonacci(n):", "--max-new-tokens", str(NEW_TOKENS), "--ignore-eos"]),
              ("paddle", "generate --runtime paddle (64 new tokens)", tool("generate") + [
                  w("onnx"), "--runtime", "paddle", "--prompt", "def fibonacci(n):", "--max-new-tokens",
                  str(NEW_TOKENS), "--ignore-eos"]),
              ("import", "fork fixture", [sys.executable, os.path.join(ROOT, "tools", "fixtures", "fork_shaped.py"),
                                          w("fork"), "--shape", args.shape]
               + (["--layers", str(args.layers)] if args.layers else [])),
              ("import", "import_fleet --verify", tool("import_fleet") + [w("fork"), w("imported"), "--verify",
                                                                         "--qkv-layout", "grouped", "--up-gate-order",
                                                                         "gate-up", "--no-progress"]),
              ("merge", "tp split", [sys.executable, os.path.join(ROOT, "tools", "fixtures", "tp_split.py"),
                                     w(f"vha-{first}"), w("tp2")]),
              ("merge", "merge_tp_checkpoint (t = 2)", tool("merge_tp_checkpoint") + [w("tp2"), w("merged")]),
              ("train", "pretrain data", tool("make_pretrain_data") + ["stdlib", "--tokenizer", w("src"),
                                                                      "--corpus-mb", "1", "--out", w("data/stdlib"),
                                                                      "--no-progress"]),
              ("train", "train 2 steps (batch 1 x 128)", tool("train") + [
                  os.path.join(ROOT, "configs", "tiny-vha.json"), "--model_name_or_path", w(f"vha-{first}"),
                  "--dataset", "pretrain", "--input_dir", w("data/stdlib"), "--max_steps", "2", "--save_steps", "2",
                  "--max_seq_len", "128", "--per_device_train_batch_size", "1", "--per_device_eval_batch_size", "1",
                  "--max_eval_samples", "1", "--eval_steps", "2", "--warmup_steps", "0", "--logging_steps", "1",
                  "--disable_tqdm", "true", "--output_dir", w("train"), "--overwrite_output_dir", "true"])]
    return [s for s in steps if s[0] in args.steps]


# --- decode speed: three runtimes, one prompt ------------------------------------------------------------------

OURS = """
import json, sys, time
import numpy as np
from paddle_vha.serve.ort_session import OrtDecoder
from paddle_vha.serve.generate import generate
folder, ids, new, threads = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
sess = OrtDecoder.from_dir(folder, threads=threads)
res = generate(sess, np.asarray([ids]), new)
print(json.dumps(dict(prefill_s=res.prefill_seconds, decode_tps=(new - 1) / res.decode_seconds,
                      tokens=res.tokens[0].tolist())))
"""

HF = """
import json, sys, time
import torch
from transformers import AutoModelForCausalLM
folder, ids, new, threads = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
torch.set_num_threads(threads)
model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
with torch.no_grad():
    t0 = time.perf_counter()
    out = model(torch.tensor([ids]), use_cache=True)
    t1 = time.perf_counter()
    toks, past = [int(out.logits[0, -1].argmax())], out.past_key_values
    for _ in range(new - 1):
        out = model(torch.tensor([[toks[-1]]]), past_key_values=past, use_cache=True)
        past = out.past_key_values
        toks.append(int(out.logits[0, -1].argmax()))
    t2 = time.perf_counter()
print(json.dumps(dict(prefill_s=t1 - t0, decode_tps=(new - 1) / (t2 - t1), tokens=toks)))
"""

GENAI = """
import json, sys, time
import onnxruntime_genai as og
folder, ids, new, threads = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
config = og.Config(folder)
config.clear_providers()
model = og.Model(config)
params = og.GeneratorParams(model)
params.set_search_options(max_length=len(ids) + new, min_length=len(ids) + new, do_sample=False)
gen = og.Generator(model, params)
t0 = time.perf_counter()
gen.append_tokens(ids)
gen.generate_next_token()
t1 = time.perf_counter()
toks = [int(gen.get_next_tokens()[0])]
while not gen.is_done():
    gen.generate_next_token()
    toks.append(int(gen.get_next_tokens()[0]))
t2 = time.perf_counter()
print(json.dumps(dict(prefill_s=t1 - t0, decode_tps=(len(toks) - 1) / (t2 - t1), tokens=toks)))
"""


def prompt_ids(src: str, vocab: int):
    """PROMPT_LEN token ids: the fixture's tokenizer on standard-library text (ids < vocab)."""
    import sysconfig

    text = open(os.path.join(sysconfig.get_paths()["stdlib"], "argparse.py"), encoding="utf-8").read()
    try:
        from tokenizers import Tokenizer

        ids = Tokenizer.from_file(os.path.join(src, "tokenizer.json")).encode(text).ids
    except Exception:  # noqa: BLE001 - no tokenizer: bytes
        ids = list(text.encode())
    return [i % vocab for i in ids[:PROMPT_LEN]]


def decode_rows(args, w, log):
    """One row per runtime: decode tokens/s and prefill time, measured one after another in this run."""
    vocab = json.load(open(os.path.join(w("folded"), "config.json")))["vocab_size"]
    ids = json.dumps(prompt_ids(w("src"), vocab))
    hf = os.path.join(ROOT, "tools", "hf_env.sh")
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    runs = [("paddle-vha (onnxruntime, --cache concat)", [sys.executable, "-c", OURS, w("onnx")], None),
            ("paddle-vha (onnxruntime, --cache buffer)", [sys.executable, "-c", OURS, w("onnx-buffer")], None),
            ("Hugging Face transformers (torch fp32)", ["bash", hf, "python", "-c", HF, w("folded")], clean),
            ("onnxruntime-genai", ["bash", hf, "python", "-c", GENAI, w("onnx")], clean)]
    rows, tokens = [], {}
    for label, cmd, env in runs:
        wall, rss, rc, tail = run_measured(cmd + [ids, str(NEW_TOKENS), str(args.threads)], log, env)
        if rc != 0:
            rows.append(dict(runtime=label, error=tail.strip().splitlines()[-1][:200] if tail.strip() else f"rc {rc}"))
            continue
        res = json.loads(tail.strip().splitlines()[-1])
        tokens[label] = res.pop("tokens")
        rows.append(dict(runtime=label, peak_rss_mb=rss, **res))
    ref = next(iter(tokens.values()), None)
    for r in rows:
        if r["runtime"] in tokens:
            r["same_tokens"] = tokens[r["runtime"]] == ref
    return rows


def print_tables(args, step_rows, dec_rows):
    print(f"\n{args.shape} shape{f', {args.layers} layers' if args.layers else ''}; {cpu_line()}; "
          f"Python {platform.python_version()}\n")
    print("| step | wall s | peak RSS MB | rc |\n| --- | ---: | ---: | ---: |")
    for r in step_rows:
        print(f"| {r['step']} | {r['wall_s']:.1f} | {r['peak_rss_mb']:.0f} | {r['rc']} |")
    if dec_rows:
        print(f"\ndecode, batch 1, prompt {PROMPT_LEN}, {NEW_TOKENS} new tokens (greedy), {args.threads} threads\n")
        print("| runtime | decode tokens/s | prefill ms | peak RSS MB | same greedy tokens |\n| --- | ---: | ---: | ---: | --- |")
        for r in dec_rows:
            if "error" in r:
                print(f"| {r['runtime']} | failed: {r['error']} | | | |")
            else:
                print(f"| {r['runtime']} | {r['decode_tps']:.1f} | {r['prefill_s'] * 1e3:.0f} | {r['peak_rss_mb']:.0f} "
                      f"| {'yes' if r['same_tokens'] else 'NO'} |")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=textwrap.dedent(__doc__.split("\n\n", 1)[1]),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", choices=("0.6b", "1.7b"), default="0.6b")
    p.add_argument("--layers", type=int, help="decoder layers (default: the shape's 28)")
    p.add_argument("--work", required=True, help="folder for every step's output (created; reused if present)")
    p.add_argument("--steps", default=",".join(STEPS), help=f"comma-separated subset of {','.join(STEPS)}")
    p.add_argument("--methods", default="svd", help="convert methods, comma-separated (default svd)")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="threads of every decode runtime")
    p.add_argument("--json", help="also write the rows here")
    args = p.parse_args(argv)
    args.steps = [s for s in args.steps.split(",") if s]
    args.methods = [m for m in args.methods.split(",") if m]
    if set(args.steps) - set(STEPS):
        p.error(f"--steps: unknown {sorted(set(args.steps) - set(STEPS))}")
    os.makedirs(args.work, exist_ok=True)
    w = lambda name: os.path.join(os.path.abspath(args.work), name)  # noqa: E731
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    step_rows = []
    for kind, label, cmd in pipeline_steps(args, w):
        made = {"fixture": w("src"), "fork fixture": w("fork"), "tp split": w("tp2"), "pretrain data": w("data")}
        if label in INPUTS and os.path.isdir(made[label]) and os.listdir(made[label]):
            log(f"{label}: reusing {made[label]}")
            continue
        if label not in INPUTS and kind not in ("generate", "paddle", "train") and "--force" not in cmd:
            cmd = cmd + ["--force"]
        wall, rss, rc, tail = run_measured(cmd, log)
        log(tail.strip()[-1500:])
        step_rows.append(dict(step=label, wall_s=wall, peak_rss_mb=rss, rc=rc))
        if rc != 0:
            log(f"{label} failed (rc {rc}); later steps may fail for want of its output")
    dec_rows = decode_rows(args, w, log) if "decode" in args.steps else []
    print_tables(args, step_rows, dec_rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(shape=args.shape, layers=args.layers, cpu=cpu_line(), steps=step_rows, decode=dec_rows),
                      f, indent=2)
    return 0 if all(r["rc"] == 0 for r in step_rows) else 1


if __name__ == "__main__":
    sys.exit(main())
