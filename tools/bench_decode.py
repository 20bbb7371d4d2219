#!/usr/bin/env python
"""Decode-step latency in onnxruntime: folded VHA (GQA-2), folded shared-KV VHA (GQA-2, one cache tensor) and the
same-size GQA-8, with the bytes each step reads.

    python tools/bench_decode.py                       # hidden 512, 4 layers, 16 query heads, head_dim 64
    python tools/bench_decode.py --contexts 1024 4096 --batches 1 --repeats 5

Both models are exported with tools/export_onnx.py's code path (fp32, standard ONNX ops) into a temporary folder.
One decode step = one new token per sequence with a filled cache of `context` tokens. Bytes per step:
    weights (read once) + KV read by attention (past) + the past -> present copy the KV-cache interface
    requires (read past, write past + new),
so the byte-predicted time ratio is (W + 3 KV_8) / (W + 3 KV_2). Shared KV caches one tensor S instead of two (half
the cache), but attention reads S twice, as keys and as values: W + 4 S = W + 2 KV_2, so over plain VHA the bytes
predict (W + 3 KV_2) / (W + 2 KV_2), 1.5x at long context (2x if S were read once).

glibc returns large freed blocks to the OS and takes them back page by page (a page fault per 4 KB), which halves
the speed of the past -> present copy into fresh output arrays; unless --default-malloc is given the benchmark
re-runs itself with MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=1e11 (a setting serving processes can use too). The table prints the measured median step time,
achieved GB/s against that byte count, and measured vs predicted GQA-8 / GQA-2 ratios.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

from paddle_vha.cli import quiet
from paddle_vha.machine import copy_bandwidth


def build_export(root, name, h_kv, args, log, shared_kv=False, cache_io="concat"):
    import paddle
    from paddleformers.transformers import Qwen3Config, Qwen3ForCausalLM

    from paddle_vha.export.onnx_export import export_onnx
    from paddle_vha.shared_kv.config import Qwen3SharedKVConfig
    from paddle_vha.shared_kv.modeling import Qwen3SharedKVForCausalLM

    config_cls, model_cls = (Qwen3SharedKVConfig, Qwen3SharedKVForCausalLM) if shared_kv else (Qwen3Config,
                                                                                                  Qwen3ForCausalLM)
    cfg = config_cls(vocab_size=args.vocab, hidden_size=args.hidden, num_hidden_layers=args.layers,
                      num_attention_heads=args.heads, num_key_value_heads=h_kv, head_dim=args.head_dim,
                      intermediate_size=args.intermediate, max_position_embeddings=max(args.contexts) + 16,
                      tie_word_embeddings=False)
    paddle.seed(0)
    ckpt = os.path.join(root, f"{h_kv}-{shared_kv}-ckpt")  # the flavours of one model share its checkpoint
    if not os.path.isdir(ckpt):
        model_cls(cfg).save_pretrained(ckpt)
    out = os.path.join(root, name + "-onnx")
    export_onnx(ckpt, out, decode_steps=4, log=lambda m: log(f"  [{name}] {m}"), cache_io=cache_io)
    weight_bytes = sum(os.path.getsize(os.path.join(ckpt, f)) for f in os.listdir(ckpt) if f.endswith(".safetensors"))
    return cfg, out, weight_bytes


def time_step(session, cfg, batch, context, repeats, rng, min_seconds=1.0):
    import numpy as np

    from paddle_vha.serve.session import CacheBuffers

    cache = [rng.standard_normal((batch, h, context, w), dtype=np.float32) for h, w in session.cache_shapes]
    if session.cache_io == "buffer":  # the session's own buffers, as a generation that reached `context` has them
        cap = CacheBuffers.capacity_for(context + 1)
        buffers = []
        for c in cache:
            b = np.zeros(c.shape[:2] + (cap,) + c.shape[3:], np.float32)
            b[:, :, :context] = c
            buffers.append(b)
        cache = CacheBuffers(buffers, context)  # every timed step writes slot `context` again
    ids = rng.integers(0, cfg.vocab_size, size=(batch, 1))
    for _ in range(2):  # warm-up
        session.step(ids, cache)
    times, start = [], time.perf_counter()
    while len(times) < repeats or time.perf_counter() - start < min_seconds:  # short steps: more samples
        t = time.perf_counter()
        session.step(ids, cache)
        times.append(time.perf_counter() - t)
    kv_bytes = cache.nbytes if session.cache_io == "buffer" else sum(c.nbytes for c in cache)
    del cache
    return float(np.median(times)), kv_bytes


GENAI_STEP = """
import json, sys, time
import numpy as np, onnxruntime_genai as og
folder, points, vocab = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
model = og.Model(folder)
out = {}
for batch, context in points:
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=context + 12, do_sample=False, batch_size=batch)
    gen = og.Generator(model, params)
    gen.append_tokens(np.random.default_rng(0).integers(0, vocab, size=(batch, context)).astype(np.int32))
    times = []
    for _ in range(11):  # the first call also runs the prefill
        t = time.perf_counter(); gen.generate_next_token(); times.append(time.perf_counter() - t)
    out[f"{batch},{context}"] = float(np.median(times[1:]))
print(json.dumps(out))
"""


def genai_steps(folder, points, vocab, log):
    """Median onnxruntime-genai decode-step time at (batch, context) points on the same export, run in the side
    environment (tools/hf_env.sh); {} with one logged line when that environment is not there."""
    import json
    import subprocess

    py = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".venv-hf", "bin", "python")
    if not os.path.isfile(py):
        log("onnxruntime-genai: not measured (bash tools/hf_env.sh creates its side environment)")
        return {}
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    r = subprocess.run([py, "-c", GENAI_STEP, folder, json.dumps(points), str(vocab)], capture_output=True, text=True,
                       env=env)
    if r.returncode != 0:
        log(f"onnxruntime-genai: failed ({(r.stderr.strip().splitlines() or ['?'])[-1][:200]})")
        return {}
    return {tuple(map(int, k.split(","))): v for k, v in json.loads(r.stdout.strip().splitlines()[-1]).items()}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=16, help="query heads (VHA: virtual heads)")
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--intermediate", type=int, default=1536)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    p.add_argument("--contexts", type=int, nargs="+", default=[1024, 4096, 16384])
    p.add_argument("--repeats", type=int, default=9, help="timed runs per point, at least (median reported)")
    p.add_argument("--min-seconds", type=float, default=1.0, help="keep timing a point until this much time has passed")
    p.add_argument("--threads", type=int, default=0, help="onnxruntime intra-op threads (0: all cores)")
    p.add_argument("--default-malloc", action="store_true", help="keep glibc's default large-block behaviour")
    p.add_argument("--no-genai", action="store_true", help="do not time onnxruntime-genai on the same export")
    p.add_argument("--genai-max-tokens", type=int, default=8192,
                   help="time onnxruntime-genai where batch x context is at most this (it prefills the context first; "
                        "default 8192)")
    args = p.parse_args(argv)
    if not args.default_malloc and "MALLOC_MMAP_MAX_" not in os.environ and argv is None:
        env = dict(os.environ, MALLOC_MMAP_MAX_="0", MALLOC_TRIM_THRESHOLD_="100000000000")
        os.execve(sys.executable, [sys.executable, os.path.abspath(__file__)] + sys.argv[1:], env)
    quiet()
    import numpy as np

    from paddle_vha.serve.ort_session import OrtDecoder

    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    rng = np.random.default_rng(0)
    flavours = (("GQA-8", 8, False, "concat"), ("VHA->GQA-2", 2, False, "concat"), ("shared-KV", 2, True, "concat"),
                ("GQA-2 buffer", 2, False, "buffer"))
    with tempfile.TemporaryDirectory(prefix="bench-decode-") as root:
        models = {}
        for name, h_kv, shared, cache_io in flavours:
            log(f"exporting {name} (hidden {args.hidden}, {args.layers} layers, {args.heads} query heads, {h_kv} KV heads"
                f"{', one shared K=V tensor' if shared else ''}, cache {cache_io})")
            cfg, out, wbytes = build_export(root, name.replace(" ", "-"), h_kv, args, log, shared, cache_io)
            models[name] = (cfg, OrtDecoder.from_dir(out, threads=args.threads), wbytes, out)
        bandwidth = copy_bandwidth()
        log(f"copy bandwidth now: {bandwidth / 1e9:.1f} GB/s moved (read + written)")
        rows = []
        for batch in args.batches:
            for ctx in args.contexts:
                r = {"batch": batch, "context": ctx}
                for name, (cfg, sess, wbytes, _) in models.items():
                    sec, kv = time_step(sess, cfg, batch, ctx, args.repeats, rng, args.min_seconds)
                    reads = 4 if name == "shared-KV" else 3  # attention reads (S twice), past read, present written
                    r[name] = (sec, wbytes + reads * kv, wbytes, kv)
                    log(f"  batch {batch} context {ctx}: {name} {sec * 1e3:.2f} ms")
                rows.append(r)
        points = [[b, c] for b in args.batches for c in args.contexts if b * c <= args.genai_max_tokens]
        genai = genai_steps(models["VHA->GQA-2"][3], points, args.vocab, log) if points and not args.no_genai else {}
        bandwidth = (bandwidth + copy_bandwidth()) / 2  # before and after the timings
    malloc = "default malloc" if "MALLOC_MMAP_MAX_" not in os.environ else \
        f"MALLOC_MMAP_MAX_={os.environ['MALLOC_MMAP_MAX_']} MALLOC_TRIM_THRESHOLD_={os.environ.get('MALLOC_TRIM_THRESHOLD_')}"
    print(f"\nonnxruntime decode step, fp32, {malloc}, hidden {args.hidden}, {args.layers} layers, {args.heads} query heads, "
          f"head_dim {args.head_dim}, vocab {args.vocab}; median of >= {args.repeats} runs and >= {args.min_seconds} s per point")
    hdr = (f"{'batch':>5} {'context':>7} | {'GQA-8 ms':>9} {'GB/s':>6} {'KV MB':>8} | {'GQA-2 ms':>9} {'GB/s':>6} "
           f"{'KV MB':>8} | {'SKV ms':>8} {'GB/s':>6} {'KV MB':>8} | {'8/2':>6} {'pred.':>6} | {'2/SKV':>6} {'pred.':>6}")
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        (s8, b8, _, kv8), (s2, b2, _, kv2), (ss, bs, _, kvs) = r["GQA-8"], r["VHA->GQA-2"], r["shared-KV"]
        print(f"{r['batch']:>5} {r['context']:>7} | {s8 * 1e3:>9.2f} {b8 / s8 / 1e9:>6.1f} {kv8 / 1e6:>8.1f} | "
              f"{s2 * 1e3:>9.2f} {b2 / s2 / 1e9:>6.1f} {kv2 / 1e6:>8.1f} | {ss * 1e3:>8.2f} {bs / ss / 1e9:>6.1f} "
              f"{kvs / 1e6:>8.1f} | {s8 / s2:>5.2f}x {b8 / b2:>5.2f}x | {s2 / ss:>5.2f}x {b2 / bs:>5.2f}x")
    print("8/2: GQA-8 over folded VHA (GQA-2); 2/SKV: folded VHA over folded shared-KV VHA; measured, then predicted "
          "from the bytes each step moves (shared KV: its one tensor read twice by attention)")

    cfg2 = models["VHA->GQA-2"][0]
    print(f"\nfolded VHA (GQA-2) against the floor: the bytes a step must move (weights + the cache read once + the new "
          f"positions written) over this machine's copy bandwidth measured in this run, {bandwidth / 1e9:.1f} GB/s")
    hdr = (f"{'batch':>5} {'context':>7} | {'floor ms':>8} | {'concat ms':>9} {'x floor':>7} | {'buffer ms':>9} "
           f"{'x floor':>7} | {'buffer speed-up':>15} | {'genai ms':>8} {'x floor':>7}")
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        (sc, _, wbytes, kv), (sb, _, _, _) = r["VHA->GQA-2"], r["GQA-2 buffer"]
        new = r["batch"] * cfg2.num_hidden_layers * 2 * cfg2.num_key_value_heads * cfg2.head_dim * 4
        floor = (wbytes + kv + new) / bandwidth
        g = genai.get((r["batch"], r["context"]))
        gtxt = f"{g * 1e3:>8.2f} {g / floor:>6.2f}x" if g else f"{'-':>8} {'-':>7}"
        print(f"{r['batch']:>5} {r['context']:>7} | {floor * 1e3:>8.2f} | {sc * 1e3:>9.2f} {sc / floor:>6.2f}x | "
              f"{sb * 1e3:>9.2f} {sb / floor:>6.2f}x | {sc / sb:>14.2f}x | {gtxt}")
    print("concat: the standard export (present = past + new: the cache is copied every step); buffer: "
          "tools/export_onnx.py --cache buffer (the runtime's buffers in, new positions out); genai: onnxruntime-genai "
          f"0.18 running the concat export, batch x context <= {args.genai_max_tokens:,} (its prefill is slow on CPU)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
