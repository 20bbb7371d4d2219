"""Quantized formats side by side on a real checkpoint and a text file: ours (every recipe), llama.cpp's Q8_0 / Q4_0 /
Q4_K_M (by tools/export_gguf.py), onnxruntime-genai's model builder int4; file size, bits per weight, mean KL and
greedy agreement against the float32 export, perplexity, and batch-1 decode tokens/s, in one run.

    python tools/bench_quant.py CHECKPOINT WORK --text FILE [--rows ...] [--llama Q8_0 Q4_0 Q4_K_M] [--no-genai]

Quality: the text's first --windows windows of --window-len tokens (the checkpoint's tokenizer), spread evenly over
the file, teacher-forced as the export's quality gate runs them: a prefill of the first half, then one cached step a
token (llama.cpp: its own decode of each window with the same ids, its extra weight buffer types off). KL(fp32 ||
format) per position, averaged; agreement on the decisive positions (the float32 export's top token leads by >= 0.5
nats); perplexity of the window's next tokens. Every row is measured against the same float32 export's logits
(llama.cpp's F32 GGUF agrees with it to KL < 1e-4 on SmolLM2-135M; that row is printed as the check).
Speed: batch 1, a --speed-prompt token prompt from the text, then --speed-new greedy tokens, 2 threads; tokens/s of
the decode steps. Bits per weight: the file's bytes x 8 over the checkpoint's parameter count (embedding counted once
when tied). Our rows share one calibration: activation statistics over the embedded calibration text (or
--calibration-text), as the export computes them.

WORK keeps the float32 export, the GGUF files and the builder's output between runs (a rerun measures again without
rebuilding them); each of our rows is quantized into a scratch copy and removed after it is measured. Peak memory is
that of the largest row (SmolLM2-135M: ~2.5 GB; Qwen3-0.6B: ~6 GB with its float32 reference logits).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np

import bench_llamacpp  # tools/ is the script's folder, first on the path

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

ROWS = {  # name -> QuantSpec keyword arguments (or the format's default); the ablation, one change a row
    "int4 rtn b128 (old default)": dict(weights="int4", block_size=128, recipe="rtn"),
    "int4 rtn b32": dict(weights="int4", block_size=32, recipe="rtn"),
    "int4 asym b32": dict(weights="int4", block_size=32, recipe="asym"),
    "int4 search b32": dict(weights="int4", block_size=32, recipe="search"),
    "int4 awq b32": dict(weights="int4", block_size=32, recipe="awq"),
    "int4 awq b32 + int4 embedding": dict(weights="int4", block_size=32, recipe="awq", quantize_embedding=True),
    "int4 default (+ mixed 8-bit)": "int4",
    "int8 rtn b128 (old default)": dict(weights="int8", block_size=128, recipe="rtn"),
    "int8 rtn b32": dict(weights="int8", block_size=32, recipe="rtn"),
    "int8 default": "int8",
}
LLAMA_TYPES = {"F32": "f32", "Q8_0": "q8_0", "Q4_0": "q4_0", "Q4_K_M": "q4_k_m"}

# llama.cpp's logits of each window, its own decode of the ids in one call (extra buffer types off: on an AMX Xeon
# llama-cpp-python 0.3.36 crashes in their batched path)
LLAMA_LOGITS = bench_llamacpp.EXTRA_BUFTS_SWITCH + """
import sys, numpy as np
from llama_cpp import Llama
path, ids_path, out = sys.argv[1:4]
ids = np.load(ids_path)
llm = Llama(model_path=path, n_ctx=max(512, ids.shape[1] + 8), logits_all=True, verbose=False, n_threads=2,
            n_batch=512)  # a context of the window's length gave wrong logits (KL 6.3 nats for F32 on SmolLM2)
rows = []
for row in ids:
    llm.reset()
    llm.eval([int(t) for t in row])
    rows.append(np.array(llm.scores[:len(row)], np.float32))  # a copy: scores is llama's buffer, rewritten per row
np.save(out, np.stack(rows))
"""

# batch-1 decode speed on the same prompt ids as ours (llama.cpp's default f16 cache)
LLAMA_SPEED = bench_llamacpp.EXTRA_BUFTS_SWITCH + """
import json, sys, time
import numpy as np
from llama_cpp import Llama
path, prompt_path, new = sys.argv[1], sys.argv[2], int(sys.argv[3])
ids = [int(t) for t in np.load(prompt_path)]
llm = Llama(model_path=path, n_ctx=len(ids) + new + 8, verbose=False, n_threads=2, n_threads_batch=2, n_batch=512)
llm.eval(ids[:8]); llm.eval([ids[8]]); llm.reset()  # warm-up
llm.eval(ids)
nxt = int(np.argmax(llm.scores[llm.n_tokens - 1]))
t = time.perf_counter()
for _ in range(new - 1):
    llm.eval([nxt])
    nxt = int(np.argmax(llm.scores[llm.n_tokens - 1]))
print(json.dumps(dict(step=(time.perf_counter() - t) / (new - 1))))
"""

GENAI_SPEED = """
import json, sys, time
import numpy as np, onnxruntime_genai as og
folder, prompt_path, new = sys.argv[1], sys.argv[2], int(sys.argv[3])
ids = np.load(prompt_path).astype(np.int32)[None]
model = og.Model(folder)
params = og.GeneratorParams(model)
params.set_search_options(max_length=ids.shape[1] + new, do_sample=False)
gen = og.Generator(model, params)
gen.append_tokens(ids)
gen.generate_next_token()
t = time.perf_counter()
for _ in range(new - 1):
    gen.generate_next_token()
print(json.dumps(dict(step=(time.perf_counter() - t) / (new - 1))))
"""

GENAI_LOGITS = """
import json, sys
import numpy as np, onnxruntime as ort
folder, ids_path, out = sys.argv[1:4]
cfg = json.load(open(folder + "/genai_config.json"))["model"]
dec = cfg["decoder"]
sess = ort.InferenceSession(folder + "/" + dec["filename"], providers=["CPUExecutionProvider"])
ids = np.load(ids_path)
names = [i.name for i in sess.get_inputs()]
res = []
for row in ids:
    feed = {}
    s = len(row)
    for n in names:
        if n == "input_ids":
            feed[n] = row[None].astype(np.int64)
        elif n == "attention_mask":
            feed[n] = np.ones((1, s), np.int64)
        elif n == "position_ids":
            feed[n] = np.arange(s, dtype=np.int64)[None]
        elif n.startswith("past_key_values"):
            feed[n] = np.zeros((1, dec["num_key_value_heads"], 0, dec["head_size"]), np.float32)
    res.append(sess.run(["logits"], feed)[0][0].astype(np.float32))
np.save(out, np.stack(res))
"""


def compare(ref: np.ndarray, got: np.ndarray, ids: np.ndarray) -> dict:
    """Mean KL(fp32 || format), agreement on decisive positions, perplexity of the format on the windows' next
    tokens (export/quality.py's comparison, the gate's)."""
    from paddle_vha.export.quality import compare_distributions

    d = compare_distributions(ref, got, ids)
    return dict(kl=float(d["kl"].mean()), ppl=float(np.exp(d["nll"].mean())),
                agreement=float(d["same"][d["decisive"]].mean()) if d["decisive"].any() else 1.0)


def text_windows(ckpt: str, path: str, count: int, length: int) -> np.ndarray:
    """(count, length) token ids: windows spread evenly over the whole file."""
    from tokenizers import Tokenizer

    with open(path, encoding="utf-8") as f:
        ids = np.asarray(Tokenizer.from_file(os.path.join(ckpt, "tokenizer.json")).encode(f.read()).ids, np.int64)
    if len(ids) < count * length:
        sys.exit(f"error: --text {path}: {len(ids)} tokens, fewer than --windows x --window-len = {count * length}")
    starts = np.linspace(0, len(ids) - length, count).astype(int)
    return np.stack([ids[s:s + length] for s in starts])


def parameter_count(ckpt: str) -> int:
    from safetensors import safe_open

    total = 0
    for name in sorted(os.listdir(ckpt)):
        if name.endswith(".safetensors"):
            with safe_open(os.path.join(ckpt, name), "np") as f:
                for key in f.keys():
                    total += int(np.prod(f.get_slice(key).get_shape()))
    return total


def file_bytes(paths) -> int:
    return sum(os.path.getsize(p) for p in paths if os.path.isfile(p))


def onnx_files(folder: str):
    return [os.path.join(folder, f) for f in os.listdir(folder) if f.endswith((".onnx", ".onnx.data"))]


def our_speed(folder: str, prompt: np.ndarray, new: int) -> float:
    from paddle_vha.serve.generate import generate
    from paddle_vha.serve.ort_session import OrtDecoder

    sess = OrtDecoder.from_dir(folder, 2)
    generate(sess, prompt[None, :8], 4, eos_token_id=-1)  # warm-up
    res = generate(sess, prompt[None], new, eos_token_id=-1)
    return (new - 1) / res.decode_seconds


def ours(args, ids, ref, prompt, params, log):
    """Rows of our recipes: (name, MB, bits/weight, quality dict, tokens/s, what)."""
    from paddle_vha.export.calibration import text_importance
    from paddle_vha.export.quality import gate_text
    from paddle_vha.export.quantize import QuantSpec, default_spec, quantize_graph
    from paddle_vha.export.quality import teacher_forced_logits
    from paddle_vha.serve.ort_session import OrtDecoder

    fp32 = os.path.join(args.work, "fp32")
    info = json.load(open(os.path.join(fp32, "export_info.json")))
    text = gate_text(args.checkpoint, int(info["vocab_size"]), args.calibration_text)
    t = time.time()
    importance = text_importance(os.path.join(fp32, "model.onnx"), text, info["context_length"], info["cache_windows"],
                                 info["cache_io"])
    log(f"calibration: {text.source} in {time.time() - t:.0f} s")
    rows = []
    specs = [(name, default_spec(ROWS[name]) if isinstance(ROWS[name], str) else QuantSpec(**ROWS[name]))
             for name in args.rows]
    for rule in args.mixed_rows:  # the sensitivity table: the int4 default with another 8-bit rule
        items = tuple(x for x in rule.split(",") if x and x != "none")
        specs.append((f"int4 mixed {rule}", default_spec("int4", mixed=items)))
    for name, spec in specs:
        scratch = os.path.join(args.work, "scratch")
        shutil.rmtree(scratch, ignore_errors=True)
        shutil.copytree(fp32, scratch, ignore=shutil.ignore_patterns("paddle"))
        t = time.time()
        q = quantize_graph(os.path.join(scratch, "model.onnx"), spec, max_positions=int(info["context_length"]),
                           sources=info["weight_sources"], importance=importance,
                           num_layers=int(info["num_hidden_layers"]))
        took = time.time() - t
        info_q = dict(info, weights=q)
        with open(os.path.join(scratch, "export_info.json"), "w") as f:
            json.dump(info_q, f)
        sess = OrtDecoder.from_dir(scratch)
        got = teacher_forced_logits(sess, ids)
        del sess
        size = file_bytes(onnx_files(scratch))
        rows.append((f"ours {name}", size, 8 * size / params, compare(ref, got, ids),
                     our_speed(scratch, prompt, args.speed_new), f"{spec.describe()}; quantized in {took:.0f} s"))
        log(row_line(rows[-1]))
        shutil.rmtree(scratch)
    return rows


def llama(args, ids, ref, prompt, params, log):
    env = bench_llamacpp.llama_env()
    if env is None:
        log("llama.cpp: not run (.venv-llama missing: bash tools/llama_env.sh, ~20 min the first time)")
        return []
    rows = []
    ids_path = os.path.join(args.work, "eval_ids.npy")
    np.save(ids_path, ids)
    for kind in args.llama:
        path = os.path.join(args.work, "gguf", f"{kind}.gguf")
        if not os.path.isfile(path):
            os.makedirs(os.path.dirname(path), exist_ok=True)
            r = subprocess.run([sys.executable, os.path.join(HERE, "export_gguf.py"), args.checkpoint, path, "--type",
                                LLAMA_TYPES[kind], "--no-check", "--no-progress"], capture_output=True, text=True)
            if r.returncode != 0:
                log(f"llama.cpp {kind}: export_gguf failed: {(r.stderr.strip().splitlines() or ['?'])[-1][:300]}")
                continue
        out = os.path.join(args.work, f"llama-{kind}.npy")
        # extra weight buffer types off: llama-cpp-python 0.3.36 crashes in their batched path for quantized weights
        # on an AMX Xeon (SIGSEGV at n_batch > 1)
        r = bench_llamacpp._side(env[0], LLAMA_LOGITS, [path, ids_path, out], extra_bufts=False)
        if r.returncode != 0:
            log(f"llama.cpp {kind}: logits failed: {(r.stderr.strip().splitlines() or ['?'])[-1][:300]}")
            continue
        got = np.load(out)
        if kind == "F32" and compare(ref, got, ids)["kl"] > 1e-2:
            log("WARNING: llama.cpp's F32 logits disagree with our float32 export (KL > 0.01): the llama.cpp quality "
                "columns below do not compare the same model (the checkpoint, the conversion or the tokens differ)")
        prompt_path = os.path.join(args.work, "prompt.npy")
        np.save(prompt_path, prompt)
        r, retried = bench_llamacpp.run_side(env[0], LLAMA_SPEED, [path, prompt_path, args.speed_new], log)
        speed = 1.0 / json.loads(r.stdout.strip().splitlines()[-1])["step"] if r.returncode == 0 else float("nan")
        size = os.path.getsize(path)
        rows.append((f"llama.cpp {kind}", size, 8 * size / params, compare(ref, got, ids), speed,
                     "extra buffer types off" if retried else "llama.cpp's defaults (f16 cache)"))
        log(row_line(rows[-1]))
    return rows


def genai(args, ids, ref, prompt, params, log):
    env = os.environ.get("GENAI_BUILDER_VENV", os.path.join(ROOT, ".venv-genai-builder"))
    python = os.path.join(env, "bin", "python")
    if not os.path.isfile(os.path.join(env, ".genai_builder_env")):
        log(f"onnxruntime-genai builder: not run ({env} missing: bash tools/genai_builder_env.sh)")
        return []
    out = os.path.join(args.work, "genai-int4")
    if not os.path.isfile(os.path.join(out, "genai_config.json")):
        shutil.rmtree(out, ignore_errors=True)
        r = subprocess.run([python, "-m", "onnxruntime_genai.models.builder", "-i", args.checkpoint, "-o", out, "-p",
                            "int4", "-e", "cpu", "-c", os.path.join(args.work, "genai-cache")],
                           capture_output=True, text=True)
        if r.returncode != 0:
            log(f"onnxruntime-genai builder: failed: {(r.stderr.strip().splitlines() or ['?'])[-1][:300]}")
            return []
    ids_path, logits = os.path.join(args.work, "eval_ids.npy"), os.path.join(args.work, "genai-logits.npy")
    np.save(ids_path, ids)
    r = subprocess.run([python, "-c", GENAI_LOGITS, out, ids_path, logits], capture_output=True, text=True)
    if r.returncode != 0:
        log(f"onnxruntime-genai builder: logits failed: {(r.stderr.strip().splitlines() or ['?'])[-1][:300]}")
        return []
    prompt_path = os.path.join(args.work, "prompt.npy")
    np.save(prompt_path, prompt)
    r = subprocess.run([python, "-c", GENAI_SPEED, out, prompt_path, str(args.speed_new)], capture_output=True,
                       text=True)
    speed = 1.0 / json.loads(r.stdout.strip().splitlines()[-1])["step"] if r.returncode == 0 else float("nan")
    size = file_bytes(onnx_files(out))
    row = ("onnxruntime-genai builder int4", size, 8 * size / params, compare(ref, np.load(logits), ids), speed,
           "-p int4 -e cpu (its defaults), run in onnxruntime-genai")
    log(row_line(row))
    return [row]


def row_line(row) -> str:
    name, size, bpw, q, speed, what = row
    return (f"| {name} | {size / 1e6:.1f} | {bpw:.2f} | {q['kl']:.4f} | {q['agreement']:.3f} | {q['ppl']:.2f} | "
            f"{speed:.1f} | {what} |")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint", help="a stock Llama / Qwen2 / Qwen3 checkpoint with its tokenizer.json")
    p.add_argument("work", help="folder for the float32 export, GGUF files and the builder's output (reused)")
    p.add_argument("--text", required=True, help="UTF-8 text the formats are judged on (held out from calibration)")
    p.add_argument("--calibration-text", default=None, help="what our recipes calibrate on (default: the embedded)")
    p.add_argument("--windows", type=int, default=8, help="windows of the text (default 8)")
    p.add_argument("--window-len", type=int, default=128, help="tokens a window (default 128)")
    p.add_argument("--rows", nargs="*", default=list(ROWS), choices=list(ROWS), metavar="ROW",
                   help=f"our rows (default all: {'; '.join(ROWS)})")
    p.add_argument("--mixed-rows", nargs="*", default=[], metavar="RULE",
                   help="more rows: the int4 default with the 8-bit rule RULE instead (comma-separated roles, 'none' "
                        "for all 4-bit): the per-tensor sensitivity table, e.g. none v_proj lm_head down_proj@-8-")
    p.add_argument("--llama", nargs="*", default=["F32", "Q8_0", "Q4_0", "Q4_K_M"], choices=list(LLAMA_TYPES))
    p.add_argument("--no-genai", action="store_true", help="skip onnxruntime-genai's builder")
    p.add_argument("--speed-prompt", type=int, default=128, help="prompt tokens before the timed decode (128)")
    p.add_argument("--speed-new", type=int, default=64, help="greedy tokens timed (64)")
    args = p.parse_args(argv)
    if args.windows < 1 or args.window_len < 4:
        p.error("--windows >= 1 and --window-len >= 4")
    if not os.path.isfile(os.path.join(args.checkpoint, "tokenizer.json")):
        p.error(f"{args.checkpoint}: no tokenizer.json (the text is read as the model's tokens)")
    os.makedirs(args.work, exist_ok=True)

    def log(msg):
        print(msg, flush=True)

    import platform
    from paddle_vha.machine import cpu_line

    fp32 = os.path.join(args.work, "fp32")
    if not os.path.isfile(os.path.join(fp32, "export_info.json")):
        log(f"exporting the float32 reference: {args.checkpoint} -> {fp32}")
        r = subprocess.run([sys.executable, os.path.join(HERE, "export_onnx.py"), args.checkpoint, fp32])
        if r.returncode != 0:
            return r.returncode
    from paddle_vha.export.quality import teacher_forced_logits
    from paddle_vha.serve.ort_session import OrtDecoder

    ids = text_windows(args.checkpoint, args.text, args.windows, args.window_len)
    prompt = text_windows(args.checkpoint, args.text, 1, args.speed_prompt)[0]
    params = parameter_count(args.checkpoint)
    ref = teacher_forced_logits(OrtDecoder.from_dir(fp32), ids)
    base = dict(compare(ref, ref, ids), kl=0.0)
    log(f"{args.checkpoint}: {params / 1e6:.1f}M parameters; {ids.size} tokens of {args.text}; "
        f"{cpu_line()}, {platform.machine()}")
    log("| format | MB | bits/weight | mean KL | agreement | perplexity | tokens/s | what |")
    log("| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    rows = [("ours fp32", file_bytes(onnx_files(fp32)), 8 * file_bytes(onnx_files(fp32)) / params, base,
             our_speed(fp32, prompt, args.speed_new), "the reference")]
    log(row_line(rows[0]))
    rows += ours(args, ids, ref, prompt, params, log)
    rows += llama(args, ids, ref, prompt, params, log)
    if not args.no_genai:
        rows += genai(args, ids, ref, prompt, params, log)
    log("\nsummary (same table):")
    for r in rows:
        log(row_line(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
