#!/usr/bin/env python
"""Serving on a CPU, side by side: our session per weight format, onnxruntime-genai on the same export, llama.cpp per
GGUF format on the same checkpoint, Hugging Face transformers (torch) fp32 on the checkpoint; tokens/s, ms per decode
step and each one's floor, in one run.

    python tools/bench_serve_cpu.py WORK [--shape 0.6b] [--layers N] [--checkpoint DIR] [--formats fp32 int8 int4]
                                    [--kv-caches fp32 int8] [--llama-formats F32 F16 Q8_0 Q4_0]
                                    [--llama-kv default f16 q8_0] [--batch 1] [--prompt 128] [--new 128]

WORK (created) receives the checkpoint (tools/fixtures/qwen3_shaped.py at --shape, tied, random bf16 weights: speed
does not depend on their values) unless --checkpoint names one, its float32 export (tools/export_onnx.py's code, 2
validation steps) and one copy per quantized format, quantized by the export's own quantize_graph (the
MatMulNBitsQuantizer path of --weights int8 / int4; the quality gate is the export's, not re-run here). Each runtime
is timed in a fresh process, one after the other: a prefill of --prompt random tokens, then --new greedy tokens.

--kv-caches int8 adds, per weight format, a copy with the export's int8 KV cache (paddle_vha/export/kv_cache.py's
rewrite of that copy; the quality gate is the export's, not re-run here); --llama-kv the llama.cpp cache types
(tools/bench_llamacpp.py: default, or f16 / q8_0 with flash attention on). Each row says its cache.

Floor: the bytes a decode step must read (the weights its MatMuls read, the LM head included; the KV cache at the
mean context, read once, in the row's cache format: float32 4 bytes a value, our int8 (head_dim + 4) / head_dim,
llama.cpp f16 2, q8_0 34 / 32) over this machine's read bandwidth measured in the same run
(paddle_vha.machine.read_bandwidth: a 256 MB numpy reduction, bytes read; the copy bandwidth is printed beside it).
Peak RSS: each row's own process (its VmHWM). Memory: a full-size export holds about 1.7x the float32 weights
(Qwen3-0.6B: 4.6 GB; 1.7B: 12.2 GB; paddle_vha/export/memory.py), refused up front; run full sizes under the shared
lock (flock /work/locks/fullsize.lock ...). HF needs the side environment (tools/hf_env.sh); without it that row is
skipped. llama.cpp (tools/bench_llamacpp.py) needs tools/llama_env.sh's .venv-llama.

Batch > 1 (e.g. --batch 8 --prompt 4096 --cache buffer --new 16): our session and llama.cpp prefill row 0 only (in
chunks of 512) and copy its cache to the other rows (llama.cpp: llama_memory_seq_cp between per-row KV streams), so a
long-context prefill stays affordable on 2 cores; the decode steps then run every row. --context random fills our
session's and HF's caches with random keys and values instead (decode speed does not depend on them), and llama.cpp's
with a 512-position prefill's cache tiled to the prompt's length in every row (llama_state_seq_set_data: its own cache
types, no 16K prefill); HF otherwise prefills every row. onnxruntime-genai is refused at batch > 1 with the memory its
one-call prefill of every row would need for attention scores, when that does not fit. The KV cache must fit: batch x
layers x 2 x KV heads x head_dim x (prompt + new) x 4 bytes (x 2 for the concat flavour, whose step writes a new
present; the largest of --kv-caches) + the float32 weights, refused up front otherwise (Qwen3-0.6B, batch 8: 7.8 GB at
4K + 16 new in the buffer flavour; 30.3 GB at 16K).
All runtimes use the same threads (one per core this process may run on).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

import bench_llamacpp  # tools/ is the script's folder, first on the path
from paddle_vha.machine import copy_bandwidth, cpu_line, read_bandwidth

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
THREADS = len(os.sched_getaffinity(0))
TUNED_MALLOC = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": "100000000000"}

OURS = bench_llamacpp.PEAK_RSS + """
import json, sys, time
import numpy as np
from paddle_vha.serve.generate import generate
from paddle_vha.serve.ort_session import OrtDecoder
folder, batch, prompt, new, threads = sys.argv[1], *map(int, sys.argv[2:6])
sess = OrtDecoder.from_dir(folder, threads)
vocab = min(151643, json.load(open(folder + "/config.json"))["vocab_size"])  # random ids the model has
ids = np.random.default_rng(0).integers(0, vocab, size=(batch, prompt))
generate(sess, ids[:, :8], 4, eos_token_id=-1)  # warm-up
res = generate(sess, ids, new, eos_token_id=-1)
print(json.dumps(dict(prefill=res.prefill_seconds, step=res.decode_seconds / (new - 1),
                      peak_rss=peak_rss())))
"""

GENAI = bench_llamacpp.PEAK_RSS + """
import json, sys, time
import numpy as np, onnxruntime_genai as og
folder, batch, prompt, new = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
model = og.Model(folder)
params = og.GeneratorParams(model)
params.set_search_options(max_length=prompt + new, do_sample=False, batch_size=batch)
gen = og.Generator(model, params)
t = time.perf_counter()
gen.append_tokens(np.random.default_rng(0).integers(0, 151643, size=(batch, prompt)).astype(np.int32))
gen.generate_next_token()
prefill = time.perf_counter() - t
t = time.perf_counter()
for _ in range(new - 1):
    gen.generate_next_token()
print(json.dumps(dict(prefill=prefill, step=(time.perf_counter() - t) / (new - 1),
                      peak_rss=peak_rss())))
"""

# batch > 1: as llama.cpp's rows (tools/bench_llamacpp.py), row 0's prompt prefilled (in chunks of 512) and its cache
# copied to the other rows; then greedy steps of all rows at once through the session's own step().
OURS_BATCH = bench_llamacpp.PEAK_RSS + """
import json, sys, time
import numpy as np
from paddle_vha.serve.kv_cache import random_cache_fill
from paddle_vha.serve.ort_session import OrtDecoder
from paddle_vha.serve.session import CacheBuffers
folder, batch, prompt, new, threads = sys.argv[1], *map(int, sys.argv[2:6])
context = sys.argv[6]
sess = OrtDecoder.from_dir(folder, threads)
vocab = min(151643, json.load(open(folder + "/config.json"))["vocab_size"])  # random ids the model has
rng = np.random.default_rng(0)
ids = rng.integers(0, vocab, size=(1, prompt))
sess.step(ids[:, :8], sess.prefill(ids[:, :8])[1])  # warm-up
t = time.perf_counter()
if context == "random":  # every row's context: random values where a prefill would write keys and values
    if sess.cache_io == "buffer":
        cache = sess.empty_cache(batch, CacheBuffers.capacity_for(prompt + new))
        for buf, slot in zip(cache.buffers, cache.slots):
            random_cache_fill(slot, buf, prompt, rng)
        cache = CacheBuffers(cache.buffers, prompt, cache.slots)
    else:
        cache = sess.empty_cache(batch, prompt)
        for buf, slot in zip(cache, sess.cache_slots):
            random_cache_fill(slot, buf, prompt, rng)
    nxt = rng.integers(0, vocab, size=(batch, 1))
else:  # row 0's prompt prefilled in chunks of 512, its cache copied to the other rows
    cache = sess.empty_cache(1, CacheBuffers.capacity_for(prompt + new) if sess.cache_io == "buffer" else 0)
    for s in range(0, prompt, 512):
        logits, cache = sess.run(ids[:, s: s + 512], cache, np.ones((1, min(prompt, s + 512)), np.int64))
    if sess.cache_io == "buffer":  # (1, H, capacity, d) -> (batch, H, capacity, d), row 0 copied
        cache = CacheBuffers([np.repeat(b, batch, axis=0) for b in cache.buffers], cache.length, cache.slots)
    else:
        cache = [np.repeat(c, batch, axis=0) for c in cache]
    nxt = np.repeat(logits[:, -1].argmax(-1), batch)[:, None]
mask = np.ones((batch, prompt + 1), np.int64)
logits, cache = sess.step(nxt, cache, mask)
prefill = time.perf_counter() - t
t = time.perf_counter()
for k in range(1, new - 1):
    mask = np.ones((batch, prompt + k + 1), np.int64)
    logits, cache = sess.step(logits[:, -1].argmax(-1)[:, None], cache, mask)
note = ("context: random values (no prefill timed)" if context == "random"
        else "prefill: row 0, its cache copied to the other rows")
print(json.dumps(dict(prefill=prefill, step=(time.perf_counter() - t) / (new - 2), note=note,
                      peak_rss=peak_rss())))
"""

HF = bench_llamacpp.PEAK_RSS + """
import json, os, sys, time
import numpy as np, torch
from transformers import AutoModelForCausalLM, DynamicCache
folder, batch, prompt, new = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
context = sys.argv[5]
torch.set_num_threads(max(1, len(os.sched_getaffinity(0))))
model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
cfg = model.config
rng = np.random.default_rng(0)
with torch.no_grad():
    t = time.perf_counter()
    if context == "random":  # every row's context: random keys and values, as the other runtimes' rows
        shape = (batch, cfg.num_key_value_heads, prompt, cfg.head_dim)
        past = DynamicCache([(torch.from_numpy(rng.standard_normal(shape, np.float32)),
                              torch.from_numpy(rng.standard_normal(shape, np.float32)))
                             for _ in range(cfg.num_hidden_layers)])
        nxt = torch.tensor(rng.integers(0, 151643, size=(batch, 1)))
    else:
        out = model(torch.tensor(rng.integers(0, 151643, size=(batch, prompt))), use_cache=True)
        past, nxt = out.past_key_values, out.logits[:, -1:].argmax(-1)
    prefill = time.perf_counter() - t
    t = time.perf_counter()
    for _ in range(new - 1):
        out = model(nxt, past_key_values=past, use_cache=True)
        past, nxt = out.past_key_values, out.logits[:, -1:].argmax(-1)
print(json.dumps(dict(prefill=prefill, step=(time.perf_counter() - t) / (new - 1),
                      note="context: random values (no prefill timed)" if context == "random" else "",
                      peak_rss=peak_rss())))
"""


def failure_line(r: subprocess.CompletedProcess) -> str:
    """A failed child's last line of stderr, or how it ended when it wrote none (SIGKILL: most likely the OOM killer)."""
    last = (r.stderr or "").strip().splitlines()
    if last:
        return last[-1][:300]
    if r.returncode < 0:
        sig = -r.returncode
        return f"killed by signal {sig}" + (" (SIGKILL: out of memory?)" if sig == 9 else "")
    return f"exit {r.returncode}, nothing on stderr"


def run_json(python, code, args, env_extra=None, log=print):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(env_extra or {})
    r = subprocess.run([python, "-c", code, *map(str, args)], capture_output=True, text=True, env=env, cwd=ROOT)
    if r.returncode != 0:
        log(f"  failed: {failure_line(r)}")
        return None
    return json.loads(r.stdout.strip().splitlines()[-1])


def step_weight_bytes(onnx_path: str) -> int:
    """Bytes of the initializers a decode step's MatMuls read (B, scales; through Transposes, so a tied head counts
    the embedding once), from the graph's headers."""
    import onnx

    model = onnx.load(onnx_path, load_external_data=False)
    made = {o: n for n in model.graph.node for o in n.output}
    sizes = {}
    for t in model.graph.initializer:
        ext = {e.key: e.value for e in t.external_data}
        sizes[t.name] = int(ext["length"]) if "length" in ext else len(t.raw_data)
    read = set()
    for n in model.graph.node:
        if n.op_type not in ("MatMul", "MatMulNBits"):
            continue
        for name in n.input[1:]:
            while name in made and made[name].op_type == "Transpose":
                name = made[name].input[0]
            read.add(name)
    return sum(sizes.get(k, 0) for k in read)


def kv_bytes(cfg: dict, batch: int, context: int, kv: str = "fp32") -> int:
    """Bytes of our KV cache at `context` positions: float32, or the int8 cache's (paddle_vha/export/kv_cache.py)."""
    from paddle_vha.export.kv_cache import cache_bytes_per_position

    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    shapes = [(cfg["num_key_value_heads"], head_dim)] * cfg["num_hidden_layers"]
    return batch * context * cache_bytes_per_position(kv, shapes)


def check_memory_first(args) -> None:
    """The export's own up-front refusal (paddle_vha/export/memory.py, a quantized export's need), before anything is
    written: the float32 bytes from the checkpoint's headers, or from the shape the fixture would write."""
    from paddle_vha.export.memory import check_memory

    if args.checkpoint:
        from paddle_vha.checkpoint.folder import CheckpointFolder
        from paddle_vha.export.reference import weight_bytes

        folder = CheckpointFolder.open(args.checkpoint)
        total, largest = weight_bytes(folder), weight_bytes(folder, largest=True)
    else:
        from fixtures.qwen3_shaped import qwen3_config, tensor_shapes  # tools/ is the script's folder

        cfg = qwen3_config(args.shape, args.layers, kv_heads=args.kv_heads)
        sizes = [4 * int(__import__("numpy").prod(s)) for s in tensor_shapes(cfg).values()]
        total, largest = sum(sizes), max(sizes)
    check_memory(total, args.checkpoint or f"a {args.shape} checkpoint", largest, quantized=True)
    check_cache_memory(args, total)


def check_cache_memory(args, float_bytes: int) -> None:
    """ExportError (one line) when a timed session would not fit: its float32 KV cache (batch x layers x 2 x KV heads
    x head_dim x (prompt + new) x 4 bytes; twice that for the concat flavour, whose step writes a new present) plus the
    float32 weights, over MemAvailable. llama.cpp's f16 cache needs half the buffer flavour's."""
    from paddle_vha.export.errors import ExportError
    from paddle_vha.export.memory import available_bytes

    if args.checkpoint:
        cfg = json.load(open(os.path.join(args.checkpoint, "config.json")))
    else:
        from fixtures.qwen3_shaped import qwen3_config  # tools/ is the script's folder

        cfg = qwen3_config(args.shape, args.layers, kv_heads=args.kv_heads)
    kv = kv_bytes(cfg, args.batch, args.prompt + args.new, "int8" if args.kv_caches == ["int8"] else "fp32")
    need = kv * (2 if args.cache == "concat" else 1) + float_bytes
    free = available_bytes()
    if free is not None and need > free:
        raise ExportError(f"batch {args.batch} x {args.prompt + args.new} positions: the session needs about "
                          f"{need / 1e9:.1f} GB ({kv / 1e9:.1f} GB of "
                          f"{'int8' if args.kv_caches == ['int8'] else 'float32'} KV cache"
                          f"{' x 2 for the concat flavour' if args.cache == 'concat' else ''} + "
                          f"{float_bytes / 1e9:.1f} GB of float32 weights); this machine has {free / 1e9:.1f} GB "
                          "available (MemAvailable)")


def prepare(args, log):
    """(checkpoint folder, {format: our export folder}, {format: onnxruntime-genai's export folder}) in WORK, writing
    what is missing. Ours are in --cache's flavour; genai reads the concat flavour (the one with a genai_config.json),
    written too when genai is timed."""
    ckpt = args.checkpoint or os.path.join(args.work, "checkpoint")
    if not os.path.isdir(ckpt):
        from fixtures.qwen3_shaped import make_checkpoint  # tools/ is the script's folder, first on the path

        log(f"writing a {args.shape} checkpoint ({args.layers or 'all'} layers, {args.kv_heads} KV heads, random bf16) "
            f"to {ckpt}")
        tmp = ckpt + ".tmp"  # written aside and renamed: an interrupted run leaves no half checkpoint to reuse
        shutil.rmtree(tmp, ignore_errors=True)
        make_checkpoint(tmp, args.shape, layers=args.layers, kv_heads=args.kv_heads)
        os.replace(tmp, ckpt)
    ours = {}
    for key in variants(args.formats, args.block_size):
        for kv in args.kv_caches:
            for op in args.attention_ops:
                folder = export_folder(args, ckpt, args.cache, key, log)
                if op == "fused":
                    if args.cache != "concat":
                        log("fused attention: not timed (--attention-op fused is offered for --cache concat)")
                        continue
                    ours[(key, kv, op)] = fused_copy(args, ckpt, folder, kv, log)
                else:
                    ours[(key, kv, op)] = folder if kv == "fp32" else int8_cache_copy(args, ckpt, folder, log)
    genai = {}
    if genai_timed(args):
        genai = {key: export_folder(args, ckpt, "concat", key, log)
                 for key in variants(args.genai_formats, args.block_size)}
    return ckpt, ours, genai


def hf_python() -> str:
    """The python of tools/hf_env.sh's side environment (HF transformers, onnxruntime-genai); it may be missing."""
    return os.path.join(os.environ.get("HF_VENV", os.path.join(ROOT, ".venv-hf")), "bin", "python")


def genai_timed(args) -> bool:
    return not args.no_genai and bool(args.genai_formats) and os.path.isfile(hf_python())


def variants(formats, blocks) -> list:
    """The exports to time: "fp32", and per quantized format one per block size ("int4" at the export's default
    block, "int4-b128" at 128, ...)."""
    from paddle_vha.export.quantize import DEFAULT_BLOCK_SIZE

    out = []
    for fmt in formats:
        if fmt == "fp32":
            out.append(fmt)
        else:
            out += [fmt if b in (None, DEFAULT_BLOCK_SIZE) else f"{fmt}-b{b}" for b in blocks or [None]]
    return out


def export_folder(args, ckpt, cache_io, key, log) -> str:
    """WORK/<fmt>[-b<block>][-buffer]: the float32 export (tools/export_onnx.py's code, 2 validation steps), or a copy
    of it quantized by the export's own quantize_graph (--block-size; the quality gate is the export's, not re-run)."""
    from paddle_vha.export.onnx_export import export_onnx
    from paddle_vha.export.quantize import quantize_graph

    tail = "-buffer" if cache_io == "buffer" else ""
    fp32 = os.path.join(args.work, "fp32" + tail)
    if not os.path.isfile(os.path.join(fp32, "export_info.json")):
        t = time.time()
        export_onnx(ckpt, fp32, decode_steps=2, log=lambda m: log("  " + m), force=True, cache_io=cache_io)
        log(f"fp32 export ({cache_io} flavour): {time.time() - t:.0f} s")
    if key == "fp32":
        return fp32
    fmt, _, block = key.partition("-b")
    block = int(block) if block else None
    out = os.path.join(args.work, key + tail + ("-default" if args.recipe == "default" else ""))
    if os.path.isfile(os.path.join(out, "export_info.json")):
        return out
    tmp = out + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(fp32, tmp, ignore=shutil.ignore_patterns("paddle"))
    t = time.time()
    path = os.path.join(tmp, "export_info.json")
    meta = json.load(open(path))
    weights, extra = _recipe(args, ckpt, fp32, fmt, block, meta)
    info = quantize_graph(os.path.join(tmp, "model.onnx"), weights, block, max_positions=meta["context_length"],
                          num_layers=meta["num_hidden_layers"], **extra)
    meta["ops"], meta["weights"] = info.pop("ops"), dict(info, quality="not checked (bench copy)")
    meta["external_data"] = "model.onnx.data" if info["external_data"] else None
    with open(path + ".tmp", "w") as f:
        json.dump(meta, f, indent=2)
    os.replace(path + ".tmp", path)
    os.rename(tmp, out)
    log(f"{fmt} (block {info['block_size']}, {cache_io} flavour): quantized in {time.time() - t:.0f} s, "
        f"{info['weight_bytes'] / 1e6:.0f} MB of weights")
    return out


def _recipe(args, ckpt, fp32, fmt, block, meta):
    """(weights, more keyword arguments) of quantize_graph for --recipe: "rtn"
    (onnxruntime's round to nearest at the block, what the tables of docs/deploy.md timed) or "default" (what
    `export_onnx --weights FMT` writes: its recipe, mixed bits and quantized embedding, calibrated on the embedded
    text as the export is)."""
    if args.recipe == "rtn":
        return fmt, {}
    from paddle_vha.export.calibration import text_importance
    from paddle_vha.export.quality import gate_text
    from paddle_vha.export.quantize import default_spec

    if "weight_sources" not in meta:
        sys.exit(f"error: {fp32} predates export_info.json's weight_sources (the roles --recipe default needs): "
                 "remove it to export it again")
    text = gate_text(ckpt, int(meta["vocab_size"]), None)
    importance = text_importance(os.path.join(fp32, "model.onnx"), text, meta["context_length"], meta["cache_windows"],
                                 meta["cache_io"])
    return default_spec(fmt, block), dict(sources=meta["weight_sources"], importance=importance)


def _patched_copy(folder: str, out: str, patch) -> str:
    """`out`: a copy of the export `folder` (its paddle/ left out) whose graph and export_info.json patch(onnx path,
    meta) rewrote, written aside and renamed (reused when it is there)."""
    if os.path.isfile(os.path.join(out, "export_info.json")):
        return out
    tmp = out + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(folder, tmp, ignore=shutil.ignore_patterns("paddle"))
    path = os.path.join(tmp, "export_info.json")
    meta = json.load(open(path))
    patch(os.path.join(tmp, "model.onnx"), meta)
    with open(path + ".tmp", "w") as f:
        json.dump(meta, f, indent=2)
    os.replace(path + ".tmp", path)
    os.rename(tmp, out)
    return out


def int8_cache_copy(args, ckpt, folder, log) -> str:
    """<folder>-kvint8: a copy of the export `folder` with the int8 KV cache (paddle_vha/export/kv_cache.py's rewrite
    of the copy's graph; the export's quality gate is not re-run here)."""
    from paddle_vha.export.kv_cache import INT8_NAMES, quantize_cache
    from paddle_vha.export.plan import serving_plan

    def patch(onnx_path, meta):
        meta["kv_cache"] = dict(quantize_cache(onnx_path, serving_plan(ckpt, args.cache)),
                                quality="not checked (bench copy)")
        meta["cache_names"] = [list(INT8_NAMES)] * meta["num_hidden_layers"]

    out, t = folder + "-kvint8", time.time()
    if not os.path.isfile(os.path.join(out, "export_info.json")):
        _patched_copy(folder, out, patch)
        log(f"{os.path.basename(folder)}: int8 KV cache copy in {time.time() - t:.0f} s")
    return out


def fused_copy(args, ckpt, folder, kv, log) -> str:
    """<folder>-fused / -kvint8-fused: a copy of the export `folder` with every layer's attention as paddle-vha's
    fused op (paddle_vha/export/fused_attention.py; with the int8 cache, kv_cache.py's rewrite with the fused op);
    the export's checks are not re-run here."""
    from paddle_vha.export.fused_attention import fuse_float, info as fused_info
    from paddle_vha.export.kv_cache import INT8_NAMES, quantize_cache
    from paddle_vha.export.plan import serving_plan

    def patch(onnx_path, meta):
        plan = serving_plan(ckpt, args.cache)
        if kv == "int8":
            meta["kv_cache"] = dict(quantize_cache(onnx_path, plan, "fused"), quality="not checked (bench copy)")
            meta["cache_names"] = [list(INT8_NAMES)] * meta["num_hidden_layers"]
            meta["attention_op"] = fused_info("int8")
        else:
            meta["attention_op"] = fuse_float(onnx_path, plan)

    out, t = folder + ("-kvint8" if kv == "int8" else "") + "-fused", time.time()
    if not os.path.isfile(os.path.join(out, "export_info.json")):
        _patched_copy(folder, out, patch)
        log(f"{os.path.basename(folder)}: fused attention copy ({kv} cache) in {time.time() - t:.0f} s")
    return out


def genai_prefill_bytes(cfg: dict, batch: int, prompt: int) -> int:
    """One layer's float32 attention scores in genai's prefill of every row at once (batch x heads x prompt^2 x 4 B):
    onnxruntime-genai takes a batch's prompt in one AppendTokens call (it refuses a second one for batch > 1)."""
    return batch * cfg["num_attention_heads"] * prompt * prompt * 4


def label(args, key: str) -> str:
    """ "int4 b128" for the key "int4-b128"; quantized formats at the default block carry it too once several blocks
    are timed."""
    from paddle_vha.export.quantize import DEFAULT_BLOCK_SIZE

    recipe = " (default recipe)" if key != "fp32" and getattr(args, "recipe", "rtn") == "default" else ""
    if key != "fp32" and "-b" not in key and args.block_size and len(args.block_size) > 1:
        return f"{key} b{DEFAULT_BLOCK_SIZE}{recipe}"
    return key.replace("-b", " b") + recipe


def timings(args, ckpt, ours, genai, cfg, log):
    """[(label, export or checkpoint, result dict)] in the order timed."""
    from paddle_vha.export.memory import available_bytes

    hf = hf_python()
    have_hf = os.path.isfile(hf)
    rows, shape = [], (args.batch, args.prompt, args.new)
    for (fmt, kv, op), folder in ours.items():
        for malloc, extra in (("", {}), (" (tuned malloc)", TUNED_MALLOC)):
            if malloc and not args.tuned_malloc:
                continue
            name = f"ours {label(args, fmt)}, {kv} cache{', fused attention' if op == 'fused' else ''}{malloc}"
            log(f"timing {name}")
            code, argv = (OURS, [folder, *shape, THREADS]) if args.batch == 1 else \
                (OURS_BATCH, [folder, *shape, THREADS, args.context])
            res = run_json(sys.executable, code, argv, extra, log)
            if res is not None:
                res["kv"] = kv
            rows.append((name, folder, res))
    for fmt, folder in genai.items():
        scores, free = genai_prefill_bytes(cfg, args.batch, args.prompt), available_bytes()
        if args.batch > 1 and free is not None and 3 * scores > free:
            log(f"onnxruntime-genai {label(args, fmt)}: not timed: its API prefills all {args.batch} rows in one call "
                f"(AppendTokens once for batch > 1), whose attention scores, masked scores and probabilities take "
                f"3 x {scores / 1e9:.1f} GB per layer; this machine has {free / 1e9:.1f} GB available")
            continue
        log(f"timing onnxruntime-genai, {label(args, fmt)}")
        rows.append((f"genai {label(args, fmt)}, fp32 cache", folder, run_json(hf, GENAI, [folder, *shape], log=log)))
    if have_hf and not args.no_hf:
        log(f"timing HF transformers (torch) fp32{', random context' if args.context == 'random' else ''}")
        fp32 = os.path.join(args.work, "fp32" + ("-buffer" if args.cache == "buffer" else ""))
        rows.append(("HF torch fp32, fp32 cache", fp32, run_json(hf, HF, [ckpt, *shape, args.context], log=log)))
    if not have_hf:
        log(f"onnxruntime-genai and HF transformers: not timed ({hf} missing: bash tools/hf_env.sh)")
    return rows + llama_rows(args, ckpt, shape, log)


def llama_rows(args, ckpt, shape, log):
    """[(label, GGUF path, result dict with its own weight_bytes)] of llama.cpp, or [] with the reason logged."""
    if not args.llama_formats:
        return []
    env = bench_llamacpp.llama_env()
    if env is None:
        log("llama.cpp: not timed (.venv-llama missing: bash tools/llama_env.sh, ~20+ min the first time)")
        return []
    rows = []
    for fmt, path in bench_llamacpp.prepare_gguf(args.work, ckpt, args.llama_formats, env, log).items():
        for kv in args.llama_kv:
            name = f"llama.cpp {fmt}, {kv} cache" + (", FA" if kv != "default" else "")
            log(f"timing {name}")
            rows.append((name, path, bench_llamacpp.time_llama(env, path, shape, THREADS, log, kv,
                                                                           args.context)))
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("work", help="folder for the checkpoint and the exports (reused when present)")
    p.add_argument("--checkpoint", help="a folded / stock checkpoint to serve: Qwen3, Llama or Qwen2, with its tokenizer "
                   "for the llama.cpp rows (default: a Qwen3 written at --shape)")
    p.add_argument("--shape", default="0.6b", choices=["0.6b", "1.7b"])
    p.add_argument("--layers", type=int, default=None, help="decoder layers of the written checkpoint (default all)")
    p.add_argument("--kv-heads", type=int, default=2, help="KV heads of the written checkpoint (default 2: the "
                   "shape a Qwen3-VHA folds into, GQA-2, a quarter of stock Qwen3's 8 heads' cache)")
    p.add_argument("--formats", nargs="+", default=["fp32", "int8", "int4"], choices=["fp32", "int8", "int4"])
    p.add_argument("--kv-caches", nargs="+", default=["fp32"], choices=["fp32", "int8"],
                   help="our KV cache formats, one row each per weight format (default fp32; int8: "
                        "tools/export_onnx.py --kv-cache int8's graph)")
    p.add_argument("--attention-ops", nargs="+", default=["stock"], choices=["stock", "fused"],
                   help="our attention, one row each per weight and cache format (fused: paddle-vha's onnxruntime op, "
                        "tools/export_onnx.py --attention-op fused's graph; --cache concat)")
    p.add_argument("--genai-formats", nargs="+", default=["fp32", "int4"], choices=["fp32", "int8", "int4"])
    p.add_argument("--batch", type=int, default=1, help="rows; > 1: row 0 prefilled, its cache copied to the others")
    p.add_argument("--cache", default="concat", choices=["concat", "buffer"],
                   help="our export's cache flavour (buffer: in place, ours only; WORK/fp32-buffer, ...)")
    p.add_argument("--block-size", type=int, nargs="+", default=None, help="the int8 / int4 copies' MatMulNBits "
                   "block(s), one row per format and block (default: the export's, 128; WORK/int4-b<N>...)")
    p.add_argument("--context", default="prefill", choices=["prefill", "random"],
                   help="batch > 1: prefill (our session: row 0, its cache copied; HF: every row) or random (our "
                   "session's and HF's caches filled with random keys and values, llama.cpp's with a 512-position "
                   "prefill's cache tiled to the prompt's length: decode speed does not depend on them; genai still "
                   "prefills)")
    p.add_argument("--recipe", default="rtn", choices=["rtn", "default"],
                   help="how our int8 / int4 copies are quantized: rtn (onnxruntime's round to nearest at --block-size, "
                        "what docs/deploy.md's serving tables timed; default) or default (export_onnx's default recipe, "
                        "mixed bits and quantized embedding, calibrated as the export is)")
    p.add_argument("--prompt", type=int, default=128)
    p.add_argument("--new", type=int, default=128)
    p.add_argument("--llama-formats", nargs="*", default=list(bench_llamacpp.FORMATS),
                   choices=bench_llamacpp.FORMATS, help="GGUF formats for llama.cpp (none: no llama.cpp rows)")
    p.add_argument("--llama-kv", nargs="+", default=["default"], choices=list(bench_llamacpp.KV_TYPES),
                   help="llama.cpp's KV cache types, one row each per GGUF format (default: llama-cpp-python's own "
                        "f16 context; f16 / q8_0: type_k = type_v, flash attention on)")
    p.add_argument("--tuned-malloc", action="store_true", help="also time our session with MALLOC_MMAP_MAX_=0 ...")
    p.add_argument("--no-genai", action="store_true")
    p.add_argument("--no-hf", action="store_true")
    p.add_argument("--prepare-only", action="store_true", help="write the checkpoint and the exports into WORK, time "
                   "nothing (a later run reuses them)")
    args = p.parse_args(argv)
    if args.new < 2 or args.prompt < 1 or args.batch < 1:
        p.error("--new must be >= 2, --prompt and --batch >= 1")
    if args.context == "random" and args.batch == 1:
        p.error("--context random applies to --batch > 1 (batch 1 times a real prefill)")
    from paddle_vha.cli import quiet

    quiet()
    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    from paddle_vha.checkpoint.contract import CheckpointError
    from paddle_vha.export.errors import ExportError

    try:
        from paddle_vha.export.quantize import check_weights

        for fmt in args.formats:
            if fmt != "fp32":
                for block in args.block_size or [None]:
                    check_weights(fmt, block)
        check_memory_first(args)
    except (CheckpointError, ExportError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    os.makedirs(args.work, exist_ok=True)
    ckpt, ours, genai = prepare(args, log)
    if args.prepare_only:
        log(f"prepared {args.work}: {', '.join(sorted(os.listdir(args.work)))}")
        return 0
    cfg = json.load(open(os.path.join(ckpt, "config.json")))
    bandwidth, copy = read_bandwidth(), copy_bandwidth()
    rows = timings(args, ckpt, ours, genai, cfg, log)
    bandwidth, copy = (bandwidth + read_bandwidth()) / 2, (copy + copy_bandwidth()) / 2
    context = args.prompt + args.new // 2  # the mean context of the timed steps
    fp32_kv = kv_bytes(cfg, args.batch, context)
    print(f"\n{cpu_line()}; load average {os.getloadavg()[0]:.1f} (a shared machine); read bandwidth "
          f"{bandwidth / 1e9:.1f} GB/s (copy: {copy / 1e9:.1f} GB/s read + written); {model_label(ckpt)} "
          f"{cfg['num_hidden_layers']} "
          f"layers, hidden {cfg['hidden_size']}, {cfg['num_key_value_heads']} KV heads, vocab {cfg['vocab_size']}; "
          f"batch {args.batch}, prompt {args.prompt}, {args.new} new tokens (greedy); floor = (weights the step reads "
          f"+ KV cache at the mean context in the row's format; float32: {fp32_kv / 1e6:.0f} MB) / read bandwidth")
    print(table(args, rows, cfg, context, bandwidth))
    return 0


def model_label(ckpt: str) -> str:
    """What the header calls the served model: its family's label (Qwen3, Llama, Qwen2, ...)."""
    from paddle_vha.families import family_of

    return family_of(ckpt).label


def table(args, rows, cfg: dict, context: int, bandwidth: float) -> str:
    """The results, one line per row: tokens/s, ms a step, prefill, the bytes a step must read, its floor, x floor,
    peak RSS."""
    width = max([len(name) for name, _, _ in rows] + [28])
    hdr = (f"{'runtime':<{width}} | {'tokens/s':>8} | {'ms/step':>8} | {'prefill s':>9} | {'MB/step':>8} | "
           f"{'floor ms':>8} | {'x floor':>7} | {'peak RSS':>8}")
    lines = [hdr, "-" * len(hdr)]
    for name, folder, res in rows:
        if res is None:
            lines.append(f"{name:<{width}} | {'failed':>8} |")
            continue
        weights = res.get("weight_bytes") or step_weight_bytes(os.path.join(folder, "model.onnx"))
        if "kv_bytes_per_value" in res:  # llama.cpp: its cache type's bytes per value
            kv = int(kv_bytes(cfg, args.batch, context) * res["kv_bytes_per_value"] / 4)
        else:
            kv = kv_bytes(cfg, args.batch, context, res.get("kv", "fp32"))
        read = weights + kv
        floor = read / bandwidth
        step = res["step"]
        prefill = "random" if res.get("note", "").startswith("context: random") else f"{res['prefill']:.2f}"
        rss = f"{res['peak_rss'] / 1e9:.2f} GB" if res.get("peak_rss") else "-"
        lines.append(f"{name:<{width}} | {args.batch / step:>8.2f} | {step * 1e3:>8.1f} | {prefill:>9} | "
                     f"{read / 1e6:>8.0f} | {floor * 1e3:>8.1f} | {step / floor:>6.2f}x | {rss:>8}"
                     + (f" ({', '.join(res['tensor_types'])})" if res.get("tensor_types") else ""))
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
