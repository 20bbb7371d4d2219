#!/usr/bin/env python
"""One layer's decode attention on the CPU, formulation by formulation, against the bytes it must read: where a
long-context batch step of tools/bench_serve_cpu.py spends its time.

    python tools/bench_attention_cpu.py                                   # batch 8, 16,384 cached positions
    python tools/bench_attention_cpu.py --batch 1 --context 4096 --repeats 11

At batch 8 with a long context a decode step of the folded GQA-2 model is mostly attention over the float32 cache
(Qwen3-0.6B shape at 16K: 7.5 GB of the step's 7.8 GB), so its floor is the cache's bytes over the copy bandwidth.
This times one layer (--heads query heads over --kv-heads cached heads of --head-dim, one new token per row, a buffer
of --context filled positions and room for the new one) in onnxruntime's CPU execution provider:

- "buffer-flavour graph": the standard ONNX ops the buffer flavour's export runs per layer
  (paddle_vha/qwen3/functional.py grouped_attention_past_new: the group's query rows times the buffer's keys and the
  new key, scores joined, additive mask, Softmax, split, times the buffer's values and the new value, summed);
- "its two cache MatMuls": the query-key and probability-value products over the buffer alone, what any graph of
  standard ops must run (onnxruntime's MLAS GEMM with G = heads / kv-heads query rows per cached head);
- "keys stored (d, T)": the same with the keys already transposed (no transposed operand);
- "GroupQueryAttention": onnxruntime's contrib op (com.microsoft), past / present buffers bound in place (IOBinding),
  the op onnxruntime-genai's own exports use;
- "numpy matmul": the two cache products in numpy (its BLAS), outside onnxruntime, for scale.

Each is checked against a float64 numpy reference written here (max abs error printed) and timed as the median of
--repeats runs after a warm-up; GB/s is the cache bytes (keys + values) over that time, and x floor its time over the
cache bytes / the copy bandwidth (a 256 MB numpy copy, read + written) measured in the same run.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

from paddle_vha.machine import available_memory_bytes, copy_bandwidth, cpu_line

FLOAT, INT32, INT64 = 1, 6, 7  # onnx.TensorProto's element types


def session(nodes, inputs, outputs, threads):
    import onnxruntime as ort
    from onnx import helper

    graph = helper.make_graph(nodes, "attention", [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
                              [helper.make_tensor_value_info(n, FLOAT, None) for n in outputs])
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    opts.intra_op_num_threads = threads
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def reference(q, k_buf, v_buf, k_new, v_new, filled):
    """float64 grouped decode attention: q (B, H_kv, G, d) over the first `filled` buffer positions and the new one;
    (B, H_kv, G, d)."""
    k = np.concatenate([k_buf[:, :, :filled], k_new], 2).astype(np.float64)  # (B, H_kv, T + 1, d)
    v = np.concatenate([v_buf[:, :, :filled], v_new], 2).astype(np.float64)
    s = np.einsum("bhgd,bhtd->bhgt", q.astype(np.float64), k) / np.sqrt(q.shape[-1])
    p = np.exp(s - s.max(-1, keepdims=True))
    return np.einsum("bhgt,bhtd->bhgd", p / p.sum(-1, keepdims=True), v)


def formulations(q, k_buf, v_buf, k_new, v_new, filled, threads):
    """{name: (run, bytes of cache it reads, None or the float64 products (scores, probabilities x values))}: run()
    returns the attention output (B, H_kv, G, d), or for the rows of products alone those two products."""
    from onnx import helper

    b, h_kv, g, d = q.shape
    cap = k_buf.shape[2]
    scale = np.float32(d ** -0.5)
    mask = np.zeros((b, 1, g, cap + 1), np.float32)  # the buffer's empty slots hidden, as the export's additive mask
    mask[:, :, :, filled:cap] = -1e9
    n = helper.make_node
    consts = [helper.make_tensor("scale", FLOAT, [], [float(scale)]),
              helper.make_tensor("s0", INT64, [1], [0]), helper.make_tensor("s1", INT64, [1], [cap]),
              helper.make_tensor("s2", INT64, [1], [cap + 1]), helper.make_tensor("ax", INT64, [1], [3])]
    graph_nodes = [n("Constant", [], [c.name], value=c) for c in consts] + [
        n("Mul", ["q", "scale"], ["qs"]),
        n("Transpose", ["kb"], ["kbt"], perm=[0, 1, 3, 2]), n("MatMul", ["qs", "kbt"], ["s_buf"]),
        n("Transpose", ["kn"], ["knt"], perm=[0, 1, 3, 2]), n("MatMul", ["qs", "knt"], ["s_new"]),
        n("Concat", ["s_buf", "s_new"], ["s"], axis=-1), n("Add", ["s", "mask"], ["sm"]),
        n("Softmax", ["sm"], ["p"], axis=-1),
        n("Slice", ["p", "s0", "s1", "ax"], ["p_buf"]), n("Slice", ["p", "s1", "s2", "ax"], ["p_new"]),
        n("MatMul", ["p_buf", "vb"], ["y_buf"]), n("MatMul", ["p_new", "vn"], ["y_new"]),
        n("Add", ["y_buf", "y_new"], ["y"])]
    io = [("q", FLOAT, q.shape), ("kb", FLOAT, k_buf.shape), ("vb", FLOAT, v_buf.shape), ("kn", FLOAT, k_new.shape),
          ("vn", FLOAT, v_new.shape), ("mask", FLOAT, mask.shape)]
    graph = session(graph_nodes, io, ["y"], threads)
    feeds = dict(q=q, kb=k_buf, vb=v_buf, kn=k_new, vn=v_new, mask=mask)
    cache_bytes = k_buf[:, :, :filled].nbytes * 2
    out = {"buffer-flavour graph": (lambda: graph.run(None, feeds)[0], cache_bytes, None)}

    # the two products over the buffer alone (no softmax: probabilities stand in as given)
    probs = np.random.default_rng(1).random((b, h_kv, g, cap), np.float32) / cap
    two = session([n("Transpose", ["kb"], ["kbt"], perm=[0, 1, 3, 2]), n("MatMul", ["q", "kbt"], ["s"]),
                   n("MatMul", ["p", "vb"], ["y"])], [("q", FLOAT, q.shape), ("kb", FLOAT, k_buf.shape),
                                                      ("p", FLOAT, probs.shape), ("vb", FLOAT, v_buf.shape)],
                  ["s", "y"], threads)
    kt = np.ascontiguousarray(k_buf.transpose(0, 1, 3, 2))  # (B, H_kv, d, cap)
    two_t = session([n("MatMul", ["q", "kt"], ["s"]), n("MatMul", ["p", "vb"], ["y"])],
                    [("q", FLOAT, q.shape), ("kt", FLOAT, kt.shape), ("p", FLOAT, probs.shape),
                     ("vb", FLOAT, v_buf.shape)], ["s", "y"], threads)
    products = (np.einsum("bhgd,bhtd->bhgt", q.astype(np.float64), k_buf),  # float64 references of the two products
                np.einsum("bhgt,bhtd->bhgd", probs.astype(np.float64), v_buf))
    out["its two cache MatMuls"] = (lambda: two.run(None, dict(q=q, kb=k_buf, p=probs, vb=v_buf)), k_buf.nbytes * 2,
                                    products)
    out["keys stored (d, T)"] = (lambda: two_t.run(None, dict(q=q, kt=kt, p=probs, vb=v_buf)), k_buf.nbytes * 2,
                                 products)

    # GroupQueryAttention with the buffers shared in place: it writes the new key / value at position `filled`
    gqa = session([n("GroupQueryAttention", ["q", "k", "v", "pk", "pv", "seqlens_k", "total"], ["y", "pk_o", "pv_o"],
                     domain="com.microsoft", num_heads=h_kv * g, kv_num_heads=h_kv)],
                  [("q", FLOAT, [b, 1, h_kv * g * d]), ("k", FLOAT, [b, 1, h_kv * d]), ("v", FLOAT, [b, 1, h_kv * d]),
                   ("pk", FLOAT, k_buf.shape), ("pv", FLOAT, v_buf.shape), ("seqlens_k", INT32, [b]),
                   ("total", INT32, [])],
                  ["y", "pk_o", "pv_o"], threads)
    kg, vg = k_buf.copy(), v_buf.copy()  # its own buffers: it writes into them
    arrays = dict(q=np.ascontiguousarray(q.reshape(b, 1, -1)), k=np.ascontiguousarray(k_new.reshape(b, 1, -1)),
                  v=np.ascontiguousarray(v_new.reshape(b, 1, -1)), pk=kg, pv=vg,
                  seqlens_k=np.full((b,), filled, np.int32), total=np.array(filled + 1, np.int32))
    y_gqa = np.empty((b, 1, h_kv * g * d), np.float32)
    bind = gqa.io_binding()
    for name, a in arrays.items():
        bind.bind_input(name, "cpu", 0, a.dtype, list(a.shape), a.ctypes.data)
    for name, a in (("y", y_gqa), ("pk_o", kg), ("pv_o", vg)):
        bind.bind_output(name, "cpu", 0, a.dtype, list(a.shape), a.ctypes.data)

    def run_gqa(keep=arrays):  # the bound arrays live as long as this function (IOBinding holds only pointers)
        gqa.run_with_iobinding(bind)
        return y_gqa.reshape(b, h_kv, g, d)  # query head j = kv * G + i, as the grouped layout
    out["GroupQueryAttention"] = (run_gqa, cache_bytes, None)
    out["numpy matmul"] = (lambda: (np.matmul(q, k_buf.transpose(0, 1, 3, 2)), np.matmul(probs, v_buf)),
                           k_buf.nbytes * 2, products)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--context", type=int, default=16384, help="filled cache positions per row")
    p.add_argument("--heads", type=int, default=16, help="query heads (Qwen3-0.6B / 1.7B: 16)")
    p.add_argument("--kv-heads", type=int, default=2, help="cached heads (2: a folded Qwen3-VHA)")
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    p.add_argument("--repeats", type=int, default=7)
    args = p.parse_args(argv)
    if min(args.batch, args.context, args.heads, args.kv_heads, args.head_dim, args.threads, args.repeats) < 1:
        p.error("every size must be >= 1")
    if args.heads % args.kv_heads:
        p.error(f"--heads {args.heads} is not a multiple of --kv-heads {args.kv_heads}")
    cap = args.context + 1  # room for the new position (GroupQueryAttention writes it there)
    need = 4 * args.batch * args.kv_heads * cap * args.head_dim * 2 * 4  # buffers, GQA's copies, transposed keys
    free = available_memory_bytes()
    if free is not None and need > free:
        print(f"error: batch {args.batch} x {args.context} positions needs about {need / 1e9:.1f} GB here "
              f"(this machine has {free / 1e9:.1f} GB available)", file=sys.stderr)
        return 2
    rng = np.random.default_rng(0)
    g = args.heads // args.kv_heads
    q = rng.standard_normal((args.batch, args.kv_heads, g, args.head_dim), np.float32)  # (B, H_kv, G, d)
    k_buf, v_buf = (rng.standard_normal((args.batch, args.kv_heads, cap, args.head_dim), np.float32) for _ in "kv")
    k_new, v_new = (rng.standard_normal((args.batch, args.kv_heads, 1, args.head_dim), np.float32) for _ in "kv")
    want = reference(q, k_buf, v_buf, k_new, v_new, args.context)
    bandwidth = copy_bandwidth()
    rows = []
    for name, (run, nbytes, products) in formulations(q, k_buf, v_buf, k_new, v_new, args.context,
                                                      args.threads).items():
        got = run()
        if products is None:  # the attention output against the float64 reference
            err = f"{np.abs(np.asarray(got, np.float64).reshape(want.shape) - want).max():.1e}"
        else:  # the two products against theirs
            err = "products " + f"{max(np.abs(np.asarray(x, np.float64) - r).max() for x, r in zip(got, products)):.1e}"
        times = []
        for _ in range(args.repeats):
            t = time.perf_counter()
            run()
            times.append(time.perf_counter() - t)
        rows.append((name, float(np.median(times)), nbytes, err))
    bandwidth = (bandwidth + copy_bandwidth()) / 2
    cache = args.batch * args.kv_heads * args.context * args.head_dim * 4 * 2
    print(f"{cpu_line()}; load average {os.getloadavg()[0]:.1f}; {args.threads} threads; copy bandwidth "
          f"{bandwidth / 1e9:.1f} GB/s (read + written); one layer: batch {args.batch}, {args.heads} query heads over "
          f"{args.kv_heads} cached heads of {args.head_dim}, {args.context} cached positions "
          f"({cache / 1e6:.0f} MB of float32 keys + values); floor = those bytes / copy bandwidth "
          f"= {cache / bandwidth * 1e3:.2f} ms")
    hdr = f"{'formulation':<24} | {'ms':>8} | {'GB/s':>6} | {'x floor':>7} | {'max abs err vs float64':>22}"
    print(hdr)
    print("-" * len(hdr))
    for name, t, nbytes, err in rows:
        floor = nbytes / bandwidth
        print(f"{name:<24} | {t * 1e3:>8.2f} | {nbytes / t / 1e9:>6.2f} | {t / floor:>6.2f}x | {err:>22}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
