#!/usr/bin/env python
"""Benchmark tools/fold.py's streaming fold at the paper's 1.7B shape: seconds, GB/s and peak RSS.

Writes a random-weight Qwen3-VHA checkpoint (28 layers, hidden 2048, d 128, H_v 16, H_kv 2, Postmix rank 4,
intermediate 6144, vocab 151936, tied embeddings, bf16; ~3.2 GB in 2 GB shards), folds it in a fresh
subprocess (so its peak RSS is the fold's alone), prints the numbers, and deletes both folders unless --keep.
The input was just written, so it is read from the page cache: the figure is the fold's own throughput,
not the disk's read speed.

    bash tools/env.sh python tools/bench_fold.py                 # writes ~3.3 GB three times; needs ~7 GB of disk
    bash tools/env.sh python tools/bench_fold.py --layers 4      # a quick smaller run
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

from paddle_vha.cli import quiet

CHILD = r"""
import json, os, sys, time
from paddle_vha.cli import quiet
quiet()
from paddle_vha.transform.fold import fold_checkpoint, plan_fold  # imports PaddleFormers' config classes before timing, as tools/fold.py does

def status_mb(key):  # VmRSS (current) or VmHWM (peak so far) from /proc, in MB
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
base, base_peak = status_mb("VmRSS"), status_mb("VmHWM")
t0 = time.perf_counter()
plan = plan_fold({src!r}, {dst!r}, force=True, max_shard_size={shard!r})
fold_checkpoint(plan, progress=False)
dt = time.perf_counter() - t0
peak = status_mb("VmHWM")
# reference: a plain copy of the input's files (same machine, same page cache), then removed
import shutil
t0 = time.perf_counter()
shutil.copytree({src!r}, {dst!r} + ".copy")
copy_s = time.perf_counter() - t0
shutil.rmtree({dst!r} + ".copy")
print(json.dumps(dict(seconds=dt, bytes_in=plan.bytes_in, bytes_out=plan.bytes_out, rss_after_import_mb=base,
                      peak_rss_import_mb=base_peak, peak_rss_mb=peak, shards=len(plan.shards), copy_seconds=copy_s)))
"""


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--layers", type=int, default=28)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--heads", type=int, default=16, help="virtual query heads H_v")
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--rank", type=int, default=4)
    p.add_argument("--intermediate", type=int, default=6144)
    p.add_argument("--vocab", type=int, default=151936)
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--shard-size", default="2GB", help="input and output shard size (default 2GB)")
    p.add_argument("--work", default=None, help="folder for the two checkpoints (default: a new temp folder)")
    p.add_argument("--keep", action="store_true", help="keep the checkpoints")
    return p.parse_args(argv)


def write_random_vha(path, args):
    """A Qwen3-VHA checkpoint with random weights, written tensor by tensor (never the whole model in memory)."""
    from paddle_vha import Qwen3VHAConfig
    from paddle_vha.checkpoint import safetensors_io as st
    from paddle_vha.checkpoint.contract import INDEX_FILE
    from paddle_vha.vha.spec import tensor_shapes as vha_tensor_shapes

    cfg = Qwen3VHAConfig(vocab_size=args.vocab, hidden_size=args.hidden, num_hidden_layers=args.layers,
                         head_dim=args.head_dim, intermediate_size=args.intermediate, num_attention_heads=args.heads,
                         num_key_value_heads=args.kv_heads, vha_postmix_rank=args.rank, tie_word_embeddings=True,
                         max_position_embeddings=40960, rope_theta=1000000.0)
    raw = cfg.to_dict()
    raw.update(model_type=cfg.model_type, architectures=["Qwen3VHAForCausalLM"], torch_dtype=args.dtype)
    os.makedirs(path)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(raw, f, indent=2)
    code = st.dtype_code(args.dtype)
    rng = np.random.default_rng(0)
    pool = st.cast((rng.standard_normal(1 << 24) * 0.02).astype(np.float32), code)  # 16M random values, reused
    shapes = vha_tensor_shapes(cfg)
    names = sorted(shapes, key=lambda n: [int(t) if t.isdigit() else t for t in n.replace(".", " . ").split()])
    shards = st.plan_shards([(n, code, shapes[n]) for n in names], st.parse_size(args.shard_size))
    wmap, total = {}, 0
    for k, shard in enumerate(shards, 1):
        fname = st.shard_name(k, len(shards))
        w = st.ShardWriter(os.path.join(path, fname), shard)
        for name, _, shape in shard:
            n = int(np.prod(shape))
            if name.endswith("vha_premix_weight"):  # (H_kv, r, d): near identity, like a trained Premix
                a = np.eye(shape[1], shape[2])[None] + 0.3 * rng.standard_normal(shape)
                w.write(name, st.cast(a, code))
            elif name.endswith("norm.weight"):
                w.write(name, st.cast(np.ones(shape), code))
            else:  # stream from the pool in <= 16M-value pieces, at a random offset each time
                rows = shape[0]
                per_row = n // rows
                step = max(1, (1 << 24) // per_row)
                for a in range(0, rows, step):
                    b = min(rows, a + step)
                    off = int(rng.integers(0, (1 << 24) - (b - a) * per_row + 1))
                    w.write(name, pool[off: off + (b - a) * per_row].reshape((b - a,) + tuple(shape[1:])))
            wmap[name] = fname
            total += n * st.DTYPES[code].itemsize
        w.close()
    st.write_index(os.path.join(path, INDEX_FILE), wmap, total)
    return total


def main(argv=None):
    args = parse_args(argv)
    quiet()
    work = args.work or tempfile.mkdtemp(prefix="vha-bench-fold-")
    src, dst = os.path.join(work, "vha"), os.path.join(work, "gqa")
    try:
        if os.path.exists(src):
            shutil.rmtree(src)
        t0 = time.perf_counter()
        size = write_random_vha(src, args)
        print(f"input: {src}: {size / 1e9:.2f} GB random {args.dtype} Qwen3-VHA ({args.layers} layers, hidden "
              f"{args.hidden}, d {args.head_dim}, H_v {args.heads}, H_kv {args.kv_heads}, rank {args.rank}), "
              f"written in {time.perf_counter() - t0:.1f} s")
        code = CHILD.format(src=src, dst=dst, shard=args.shard_size)
        res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        if res.returncode != 0:
            print(res.stderr[-3000:], file=sys.stderr)
            return 1
        r = json.loads(res.stdout.strip().splitlines()[-1])
        moved = r["bytes_in"] + r["bytes_out"]
        print(f"fold: {r['seconds']:.2f} s, {r['bytes_in'] / 1e9:.2f} GB read + {r['bytes_out'] / 1e9:.2f} GB written "
              f"= {moved / 1e9 / r['seconds']:.2f} GB/s ({r['bytes_out'] / 1e9 / r['seconds']:.2f} GB/s written), "
              f"{r['shards']} output shard(s); a plain copy of the input files takes {r['copy_seconds']:.2f} s "
              f"({2 * r['bytes_in'] / 1e9 / r['copy_seconds']:.2f} GB/s read+written)")
        print(f"peak RSS of the fold process: {r['peak_rss_mb']:.0f} MB for a {r['bytes_out'] / 1e9:.2f} GB model "
              f"(RSS after imports {r['rss_after_import_mb']:.0f} MB, peak during imports "
              f"{r['peak_rss_import_mb']:.0f} MB: the fold itself holds <= "
              f"{r['peak_rss_mb'] - r['rss_after_import_mb']:.0f} MB above the imported libraries)")
        try:
            print(f"load average (1 min): {os.getloadavg()[0]:.2f}")
        except OSError:
            pass
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"kept {work}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
