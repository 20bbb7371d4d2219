"""llama.cpp's rows of tools/bench_serve_cpu.py: the same checkpoint converted to GGUF by llama.cpp's own converter
(F32 / F16 / Q8_0), Q4_0 by llama.cpp's quantizer (llama_model_quantize, from the F32 file), each timed through
llama-cpp-python in the side environment of tools/llama_env.sh: batch 1 through its high-level Llama object, a larger
batch through its low-level batch API (LLAMA_BATCH: one sequence id per row, the prompt prefilled once and its cache
copied to the other rows).

Its KV cache (KV_TYPES): "default" is llama-cpp-python's own context (an f16 cache; flash attention off at batch 1,
llama.cpp's "auto" in the batch API), "f16" / "q8_0" set type_k = type_v and turn flash attention on (llama.cpp keeps
a quantized V cache only with flash attention). A q8_0 cache holds 34 bytes per 32 values (int8 and an f16 scale).

The converter recognises a tokenizer by hashing the ids it gives a fixed text, so it reads the checkpoint through
WORK/llama-src: links to the checkpoint's config and weights beside Qwen's real tokenizer, rebuilt from llama.cpp's
models/ggml-vocab-qwen2.gguf (tools/fixtures/qwen2_vocab.py; speed does not depend on the tokenizer).
Disk: F32 + F16 + Q8_0 + Q4_0 take ~2.1x the float32 weights (0.6B: ~5 GB, 1.7B: ~14 GB) in WORK/gguf.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FORMATS = ("F32", "F16", "Q8_0", "Q4_0", "Q4_K_M")
# every side script's peak memory: this process's resident high-water mark (VmHWM; getrusage's ru_maxrss carries the
# parent's over fork + exec, so every child of a large bench reported the bench's own)
PEAK_RSS = """
def peak_rss():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))
"""
# cache type -> (ggml type id, bytes per cached value); "default": the library's own context parameters
KV_TYPES = {"default": (None, 2.0), "f16": (1, 2.0), "q8_0": (8, 34 / 32)}

# LLAMA_EXTRA_BUFTS=0 in a side script's environment: llama.cpp's extra weight buffer types (AMX, repacked) off, for
# llama-cpp-python's high-level Llama, which builds its model params inside (llama.cpp 0.3.36 segfaulted through its AMX
# buffers on an AMX Xeon, 2026-12; run_side retries a crashed script with it). Put before `from llama_cpp import Llama`.
EXTRA_BUFTS_SWITCH = """
import os
import llama_cpp.llama_cpp as _lc
if os.environ.get("LLAMA_EXTRA_BUFTS") == "0":
    _default = _lc.llama_model_default_params
    def _no_extra():
        mp = _default()
        mp.use_extra_bufts = False
        return mp
    _lc.llama_model_default_params = _no_extra
"""

LLAMA = EXTRA_BUFTS_SWITCH + PEAK_RSS + """
import json, os, sys, time
import numpy as np, gguf
from llama_cpp import Llama
path, batch, prompt, new, threads, kv_type = sys.argv[1], *map(int, sys.argv[2:7])
kv = {} if kv_type < 0 else dict(type_k=kv_type, type_v=kv_type, flash_attn=True)
reader = gguf.GGUFReader(path)
names = {t.name: int(t.n_bytes) for t in reader.tensors}
# a step reads every weight but the embedding table, whose one row is looked up, unless it is also the LM head
weights = sum(names.values()) - (names["token_embd.weight"] if "output.weight" in names else 0)
kinds = sorted({t.tensor_type.name for t in reader.tensors if len(t.shape) > 1})
del reader
llm = Llama(model_path=path, n_ctx=prompt + new + 8, n_threads=threads, n_threads_batch=threads, n_batch=512,
            logits_all=False, verbose=False, **kv)
ids = np.random.default_rng(0).integers(0, min(llm.n_vocab(), 151643), size=prompt).tolist()  # ids of this model
llm.eval(ids[:8]); llm.eval([ids[8]]); llm.reset()  # warm-up
t = time.perf_counter()
llm.eval(ids)
nxt = int(np.argmax(llm.scores[llm.n_tokens - 1]))
prefill = time.perf_counter() - t
t = time.perf_counter()
for _ in range(new - 1):
    llm.eval([nxt])
    nxt = int(np.argmax(llm.scores[llm.n_tokens - 1]))
print(json.dumps(dict(prefill=prefill, step=(time.perf_counter() - t) / (new - 1), weight_bytes=weights,
                      tensor_types=kinds, peak_rss=peak_rss())))
"""

# batch > 1: llama-cpp-python's low-level API (llama_batch_init / llama_decode, one sequence id per row). Each row
# has its own KV stream (kv_unified off), so a step reads batch distinct caches as the other runtimes do. The prompt
# is prefilled for sequence 0 only (in chunks of n_batch) and its cache copied to the other rows with
# llama_memory_seq_cp (between streams: a data copy), to keep a long-context prefill affordable; the decode steps then
# run all rows at once. context "random" (as our rows' --context random): no long prefill at all: a real prefill of
# FILL_SEED positions, its cache read back with llama_state_seq_get_data, its rows tiled to `prompt` positions
# (positions 0 .. prompt - 1, each layer's K and V rows repeated) and set into every row with
# llama_state_seq_set_data: llama.cpp's own restore path, in its own cache types; a decode step's time does not depend
# on what the cached rows hold. The blob's layout (llama_kv_cache::state_write) is parsed strictly: any byte left
# over or missing, a transposed V, or a position llama.cpp does not report back ends the run.
FILL_SEED = 512
LLAMA_BATCH = PEAK_RSS + f"FILL_SEED = {FILL_SEED}\n" + """
import ctypes, json, os, struct, sys, time
import numpy as np, gguf, llama_cpp as L
path, batch, prompt, new, threads, kv_type = sys.argv[1], *map(int, sys.argv[2:7])
context = sys.argv[7] if len(sys.argv) > 7 else "prompt"
reader = gguf.GGUFReader(path)
names = {t.name: int(t.n_bytes) for t in reader.tensors}
weights = sum(names.values()) - (names["token_embd.weight"] if "output.weight" in names else 0)
kinds = sorted({t.tensor_type.name for t in reader.tensors if len(t.shape) > 1})
del reader
L.llama_backend_init()
mp = L.llama_model_default_params()
mp.use_extra_bufts = os.environ.get("LLAMA_EXTRA_BUFTS") != "0"
model = L.llama_model_load_from_file(path.encode(), mp)
cp = L.llama_context_default_params()
per_seq = -(-(prompt + new + 8) // 256) * 256
cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_seq_max = batch * per_seq, 512, 512, batch
cp.n_threads = cp.n_threads_batch = threads
cp.kv_unified = False
if kv_type >= 0:  # a quantized V cache needs flash attention
    cp.type_k = cp.type_v = kv_type
    cp.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_ENABLED
ctx = L.llama_init_from_model(model, cp)
vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
b = L.llama_batch_init(512, 0, batch)

def decode(tokens, pos, seqs, want):
    b.n_tokens = len(tokens)
    for i, (t, p, s) in enumerate(zip(tokens, pos, seqs)):
        b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = int(t), int(p), 1, int(want[i])
        b.seq_id[i][0] = int(s)
    rc = L.llama_decode(ctx, b)
    if rc:
        raise SystemExit(f"llama_decode: {rc}")
    n = int(sum(want))
    return np.ctypeslib.as_array(L.llama_get_logits(ctx), shape=(n * vocab,)).reshape(n, vocab)

def tiled_state(blob, positions):  # sequence 0's state blob (FILL_SEED cells) -> `positions` cells, rows tiled
    off, parts = 0, []  # parts: bytes as they are, or K / V rows (cells, row) uint8 to tile to `positions`
    def take(fmt):
        nonlocal off
        vals = struct.unpack_from("<" + fmt, blob, off)
        off += struct.calcsize("<" + fmt)
        return vals
    magic, seq, n_stream = take("IiI")
    parts.append(struct.pack("<IiI", magic, seq, n_stream))
    filled = 0
    for _ in range(n_stream):
        (cells,) = take("I")
        parts.append(struct.pack("<I", positions if cells else 0))
        if not cells:
            continue
        filled += 1
        for i in range(cells):  # pos, n_seq_id (1), seq_id: 12 bytes a cell (no cell extension for this model)
            pos, n_seq, _s = take("iIi")
            assert pos == i and n_seq == 1, ("unexpected cell metadata", i, pos, n_seq)
        meta = np.zeros((positions, 3), np.int32)
        meta[:, 0], meta[:, 1] = np.arange(positions), 1
        parts.append(meta.tobytes())
        v_trans, n_layer = take("II")
        assert v_trans == 0, "a transposed V cache (flash attention off) is not tiled"
        parts.append(struct.pack("<II", v_trans, n_layer))
        for _ in range(2 * n_layer):  # every layer's K rows, then every layer's V rows
            ty, row = take("iQ")
            parts.append(struct.pack("<iQ", ty, row))
            parts.append(np.frombuffer(blob, np.uint8, cells * row, off).reshape(cells, row))
            off += cells * row
    assert off == len(blob) and filled == 1, ("state blob not parsed to its end", off, len(blob), filled)
    shapes = [(len(x),) if isinstance(x, bytes) else (positions, x.shape[1]) for x in parts]  # each part, written
    out = (ctypes.c_uint8 * sum(int(np.prod(sh)) for sh in shapes))()  # in place: one copy of the tiled state
    view, at = np.frombuffer(out, np.uint8), 0
    for x, sh in zip(parts, shapes):
        n = int(np.prod(sh))
        view[at: at + n].reshape(sh)[:] = np.frombuffer(x, np.uint8) if isinstance(x, bytes) else np.resize(x, sh)
        at += n
    return out

mem = L.llama_get_memory(ctx)
ids = np.random.default_rng(0).integers(0, min(vocab, 151643), size=prompt)  # Qwen's ids below its special tokens
t = time.perf_counter()
if context == "random":
    seed = min(prompt, FILL_SEED)
    last = decode(ids[:seed], range(seed), [0] * seed, [i == seed - 1 for i in range(seed)])
    size = L.llama_state_seq_get_size(ctx, 0)
    buf = (ctypes.c_uint8 * size)()
    assert L.llama_state_seq_get_data(ctx, buf, size, 0) == size
    src = tiled_state(bytes(buf), prompt)
    del buf
    for s in range(batch):
        assert L.llama_state_seq_set_data(ctx, src, len(src), s) == len(src), f"restore of row {s} failed"
        assert L.llama_memory_seq_pos_max(mem, s) == prompt - 1, (s, L.llama_memory_seq_pos_max(mem, s))
    del src
    try:  # the peak RSS reported is the serving process's, not the tiled blob's: reset the high-water mark
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass
else:
    for s in range(0, prompt, 512):
        chunk = ids[s: s + 512]
        last = decode(chunk, range(s, s + len(chunk)), [0] * len(chunk),
                      [i == len(chunk) - 1 for i in range(len(chunk))])
    for s in range(1, batch):
        L.llama_memory_seq_cp(mem, 0, s, -1, -1)
nxt = np.full(batch, int(np.argmax(last[-1])))
first = decode(nxt, [prompt] * batch, range(batch), [True] * batch)  # the first step also carries out the copies
L.llama_synchronize(ctx)
prefill = time.perf_counter() - t
if os.environ.get("LLAMA_BATCH_LOGITS"):  # tests: the first step's logits, every row (batch, vocabulary)
    np.save(os.environ["LLAMA_BATCH_LOGITS"], first)
t = time.perf_counter()
for k in range(1, new - 1):
    nxt = decode(nxt, [prompt + k] * batch, range(batch), [True] * batch).argmax(-1)
step = (time.perf_counter() - t) / (new - 2)
note = (f"context: a {min(prompt, FILL_SEED)}-position prefill's cache tiled to {prompt} positions in every row "
        "(no long prefill timed)" if context == "random" else "prefill: sequence 0, its cache copied to the other rows")
print(json.dumps(dict(prefill=prefill, step=step, weight_bytes=weights, tensor_types=kinds, note=note,
                      peak_rss=peak_rss())))
"""

# FORMATS -> tools/export_gguf.py's --type: the GGUF files are written the way users write them
GGUF_TYPES = {"F32": "f32", "F16": "f16", "Q8_0": "q8_0", "Q4_0": "q4_0", "Q4_K_M": "q4_k_m"}


def llama_env():
    """(python, unpacked sdist) of an existing .venv-llama, or None (it is not created here: ~20+ min)."""
    venv = os.environ.get("LLAMA_VENV", os.path.join(ROOT, ".venv-llama"))
    python, src = os.path.join(venv, "bin", "python"), os.path.join(venv, "src", "llama_cpp_python-0.3.36")
    ok = os.path.isfile(os.path.join(venv, ".llama_env")) and os.path.isdir(src)
    return (python, src) if ok else None


def _side(python, code, args, extra_bufts=True, **kw):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    if not extra_bufts:
        env["LLAMA_EXTRA_BUFTS"] = "0"
    kw.setdefault("cwd", ROOT)
    return subprocess.run([python, "-c", code, *map(str, args)], capture_output=True, text=True, env=env, **kw)


def run_side(python, code, args, log=print, **kw):
    """(CompletedProcess, retried): `code` (a script that honours LLAMA_EXTRA_BUFTS, e.g. after EXTRA_BUFTS_SWITCH) in
    the side environment; a run killed by SIGSEGV is run once more without llama.cpp's extra weight buffer types, and
    the log says so."""
    r = _side(python, code, args, **kw)
    if r.returncode != -11:
        return r, False
    log("  llama.cpp crashed (SIGSEGV); again without its extra weight buffer types (AMX / repacked)")
    return _side(python, code, args, extra_bufts=False, **kw), True


def llama_source(work: str, ckpt: str, src: str) -> str:
    """WORK/llama-src: links to the checkpoint's config and weights, and Qwen's real tokenizer files."""
    from fixtures.qwen3_shaped import write_tokenizer  # tools/ is the script's folder, first on the path

    out = os.path.join(work, "llama-src")
    if os.path.isfile(os.path.join(out, "tokenizer.json")):
        return out
    tmp = out + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)  # left by an interrupted run
    os.makedirs(tmp)
    for name in os.listdir(ckpt):
        if name == "config.json" or name.endswith((".safetensors", ".safetensors.index.json")):
            os.symlink(os.path.abspath(os.path.join(ckpt, name)), os.path.join(tmp, name))
    write_tokenizer(tmp, vocab_gguf=os.path.join(src, "vendor", "llama.cpp", "models", "ggml-vocab-qwen2.gguf"))
    os.rename(tmp, out)
    return out


def prepare_gguf(work: str, ckpt: str, formats, env, log) -> dict:
    """{format: GGUF path} in WORK/gguf, writing what is missing by tools/export_gguf.py's route (llama.cpp's converter,
    then its quantizer for Q4_0 / Q4_K_M) from the checkpoint with its own tokenizer, or, for the tokenizer-less
    checkpoints the benches write, from links to its weights beside Qwen's real tokenizer files (WORK/llama-src)."""
    from paddle_vha.checkpoint.contract import CheckpointError
    from paddle_vha.checkpoint.fsutil import scratch_dir
    from paddle_vha.export.gguf import LlamaSide, plan_gguf_export, write_gguf

    python, src = env
    own = os.path.isfile(os.path.join(ckpt, "tokenizer.json"))
    folder, out_dir = ckpt if own else llama_source(work, ckpt, src), os.path.join(work, "gguf")
    os.makedirs(out_dir, exist_ok=True)
    paths = {}
    for kind in formats:
        path = os.path.join(out_dir, f"{kind}.gguf")
        if not os.path.isfile(path):
            t = time.time()
            try:
                plan = plan_gguf_export(folder, path, GGUF_TYPES[kind])
                with scratch_dir("bench-gguf-") as scratch:
                    write_gguf(LlamaSide(python, src), plan, path + ".tmp", scratch, progress=False)
            except CheckpointError as e:
                log(f"  GGUF {kind}: failed: {str(e)[:300]}")
                continue
            os.rename(path + ".tmp", path)
            log(f"GGUF {kind}: written in {time.time() - t:.0f} s, {os.path.getsize(path) / 1e6:.0f} MB")
        paths[kind] = path
    return paths


def time_llama(env, path: str, shape, threads: int, log, kv: str = "default", context: str = "prompt"):
    """llama.cpp's result dict (prefill, step, weight_bytes, kv_bytes_per_value, peak_rss, ...) for one GGUF file
    with the `kv` cache (KV_TYPES), or None. context (batch > 1): "prompt" prefills row 0's prompt and copies its
    cache; "random" tiles a short prefill's cache to the prompt's length in every row (LLAMA_BATCH)."""
    code = LLAMA if shape[0] == 1 else LLAMA_BATCH
    kv_type, per_value = KV_TYPES[kv]
    extra = [context] if shape[0] > 1 else []
    r, retried = run_side(env[0], code, [path, *shape, threads, -1 if kv_type is None else kv_type, *extra], log)
    if r.returncode != 0:
        log(f"  failed: {(r.stderr.strip().splitlines() or ['?'])[-1][:300]}")
        return None
    res = json.loads(r.stdout.strip().splitlines()[-1])
    res["kv_bytes_per_value"] = per_value
    if retried:
        res["tensor_types"] = res.get("tensor_types", []) + ["no extra buffer types"]
    return res
