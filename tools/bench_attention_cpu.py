#!/usr/bin/env python
"""One layer's decode attention on the CPU, formulation by formulation, against the bytes it must read: where a
long-context batch step of tools/bench_serve_cpu.py spends its time, over a float32 cache and over an int8 one.

    python tools/bench_attention_cpu.py                                   # batch 8, 16,384 cached positions
    python tools/bench_attention_cpu.py --batch 1 --context 4096 --repeats 11

At batch 8 with a long context a decode step of the folded GQA-2 model is mostly attention over the cache (Qwen3-0.6B
shape at 16K: 7.5 GB of float32 keys and values of the step's 7.8 GB), so its floor is the cache's bytes over the
machine's read bandwidth. This times one layer (--heads query heads over --kv-heads cached heads of --head-dim, one
new token per row, a buffer of --context filled positions and room for the new one) in onnxruntime's CPU execution
provider. Over the float32 cache:

- "buffer-flavour graph": the standard ONNX ops the buffer flavour's export runs per layer
  (paddle_vha/qwen3/functional.py grouped_attention_past_new: the group's query rows times the buffer's keys and the
  new key, scores joined, additive mask, Softmax, split, times the buffer's values and the new value, summed);
- "its two cache MatMuls": the query-key and probability-value products over the buffer alone, what any graph of
  standard ops must run (onnxruntime's MLAS GEMM with G = heads / kv-heads query rows per cached head);
- "keys stored (d, T)": the same with the keys already transposed (no transposed operand);
- "GroupQueryAttention": onnxruntime's contrib op (com.microsoft), past / present buffers bound in place (IOBinding),
  the op onnxruntime-genai's own exports use;
- "numpy matmul": the two cache products in numpy (its BLAS), outside onnxruntime, for scale.

Over an int8 cache (per token and KV head scales, paddle_vha/export/int8_attention.py):

- "int8 cache graph": what `tools/export_onnx.py --kv-cache int8 --cache buffer` runs per layer: the same graph with
  both cache products in onnxruntime's MatMulIntegerToFloat (keys . queries^T with the queries in two 8-bit digits
  per row, then transposed; probabilities times the value scales in three digits . values), the new token's own key
  and value in float32;
- "its two int8 MatMuls": those two MatMulIntegerToFloat alone, over given quantized operands;
- "probabilities in 1 / 2 digits", "queries in 1 digit": the graph with fewer digits (fewer rows in a product): what
  that costs in accuracy where a sink token holds much of the mass;
- "int8 keys, float32 values": the keys' product only in int8;
- "int8 cast, float MatMul": the cache cast to float32 first, then the float32 graph's MatMuls;
- "GroupQueryAttention, int8": the contrib op's own int8 cache (static per-channel scales, here the cache's own
  per-channel largest values; onnxruntime-genai's builder calibrates them), buffers bound in place.

And over either cache, "fused DecodeAttention[Int8]": paddle-vha's onnxruntime custom-op library (ops/ort, docs/
deploy.md): one node reading each cached head once for its G query rows, online softmax, the new position in the
buffer's spare slot (--no-fused leaves these rows out).

The inputs hold an attention sink: key 0 of every cached head points along its queries, so it takes about half of
each row's probability (as trained models' first token does), and the values share a common offset per channel; the
rest is unit-variance noise. Each row is checked against a float64 numpy reference written here: "err" is the
largest absolute error against the float64 attention over the cache the row reads (its own arithmetic: float32
rounding; for int8, quantized queries and probabilities; for the rows of two products alone, relative to the largest
product), "err vs float cache" against the float64 attention over the unquantized cache (what serving from that cache
changes). Timed as the median of --repeats runs after a
warm-up; GB/s is the cache bytes the row reads (keys, values and scales) over that time, and x floor its time over
those bytes / the read bandwidth (paddle_vha.machine.read_bandwidth) measured in the same run.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

from paddle_vha.export.int8_attention import MS, PROBABILITY_DIGITS, QUERY_DIGITS, Nodes, int8_scores, int8_values
from paddle_vha.machine import available_memory_bytes, cpu_line, read_bandwidth

FLOAT, UINT8, INT8, INT32, INT64 = 1, 2, 3, 6, 7  # onnx.TensorProto's element types


def session(nodes, inputs, outputs, threads, initializers=()):
    import onnxruntime as ort
    from onnx import helper

    graph = helper.make_graph(nodes, "attention", [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
                              [helper.make_tensor_value_info(n, t, None) for n, t in outputs], list(initializers))
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    opts.intra_op_num_threads = threads
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def attention64(q, k, v):
    """float64 grouped decode attention: q (B, H_kv, G, d) over keys / values (B, H_kv, T, d); (B, H_kv, G, d)."""
    s = np.einsum("bhgd,bhtd->bhgt", q.astype(np.float64), k.astype(np.float64)) / np.sqrt(q.shape[-1])
    p = np.exp(s - s.max(-1, keepdims=True))
    return np.einsum("bhgt,bhtd->bhgd", p / p.sum(-1, keepdims=True), v.astype(np.float64))


def with_new(buf, new, filled):
    """The first `filled` buffer positions and the new one, (B, H_kv, filled + 1, d)."""
    return np.concatenate([buf[:, :, :filled], new], 2)


def inputs(batch, kv_heads, g, d, cap, filled, seed=0):
    """q (B, H_kv, G, d), float32 buffers (B, H_kv, cap, d) and new positions (B, H_kv, 1, d): unit-variance noise, the
    values offset by a per-channel mean, key 0 of every head along its queries with about half of the probability."""
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((batch, kv_heads, g, d), np.float32)
    k_buf = rng.standard_normal((batch, kv_heads, cap, d), np.float32)
    v_buf = rng.standard_normal((batch, kv_heads, cap, d), np.float32)
    v_buf += rng.standard_normal((1, kv_heads, 1, d)).astype(np.float32)
    k_new, v_new = (rng.standard_normal((batch, kv_heads, 1, d), np.float32) for _ in "kv")
    direction = q.sum(2) / np.linalg.norm(q.sum(2), axis=-1, keepdims=True)  # (B, H_kv, d)
    logits = np.einsum("bhgd,bhtd->bhgt", q, k_buf[:, :, 1:filled]) / np.sqrt(d)
    rest = np.log(np.exp(logits).sum(-1)).mean(-1)  # (B, H_kv): the log of the other keys' total weight
    along = np.einsum("bhgd,bhd->bhg", q, direction).mean(-1) / np.sqrt(d)  # (B, H_kv)
    k_buf[:, :, 0] = direction * (rest / along)[..., None]  # its logit matches the rest's: about half the mass
    return q, k_buf, v_buf, k_new, v_new


def quantize(x):
    """Per-(token, head) symmetric int8 of x (B, H, T, d), as the export writes it: (int8 values, scales
    (B, H, T, 1))."""
    scale = np.maximum(np.abs(x).max(-1, keepdims=True) / 127, 1e-30).astype(np.float32)
    return np.clip(np.round(x / scale), -127, 127).astype(np.int8), scale


class Case:
    """The inputs of one run and the float64 references every row is checked against."""

    def __init__(self, q, k_buf, v_buf, k_new, v_new, filled):
        self.q, self.k_buf, self.v_buf, self.k_new, self.v_new, self.filled = q, k_buf, v_buf, k_new, v_new, filled
        b, h_kv, g, d = q.shape
        self.cap = k_buf.shape[2]
        self.scale = np.float32(d ** -0.5)
        self.mask = np.zeros((b, 1, g, self.cap + 1), np.float32)  # the buffer's empty slots hidden, as the export's
        self.mask[:, :, :, filled:self.cap] = -1e9
        self.k8, self.k_scale = quantize(k_buf)
        self.ku8 = (self.k8.astype(np.int16) + 128).astype(np.uint8)  # the keys as the cache holds them
        self.v8, self.v_scale = quantize(v_buf)
        self.exact = attention64(q, with_new(k_buf, k_new, filled), with_new(v_buf, v_new, filled))
        self.on_int8 = attention64(q, with_new(self.k8 * self.k_scale.astype(np.float64), k_new, filled),
                                   with_new(self.v8 * self.v_scale.astype(np.float64), v_new, filled))
        s = np.einsum("bhgd,bhtd->bhgt", q.astype(np.float64), with_new(k_buf, k_new, filled)) / np.sqrt(d)
        p = np.exp(s - s.max(-1, keepdims=True))
        self.sink_mass = float((p[..., 0] / p.sum(-1)).mean())

    @property
    def float_bytes(self):
        return self.k_buf[:, :, :self.filled].nbytes * 2

    @property
    def int8_bytes(self):
        return (self.k8[:, :, :self.filled].nbytes + self.k_scale[:, :, :self.filled].nbytes) * 2


def errors(got, want, exact):
    """"<err> | <err vs float cache>" of an attention output against its own cache's float64 reference and the float
    cache's."""
    got = np.asarray(got, np.float64).reshape(exact.shape)
    return f"{np.abs(got - want).max():.1e}", f"{np.abs(got - exact).max():.1e}"


def float_rows(c: Case, threads):
    """{name: (run, bytes read, check)}: the float32 cache's formulations; check(output) -> (err, err vs float)."""
    from onnx import helper

    b, h_kv, g, d = c.q.shape
    cap, n = c.cap, helper.make_node
    consts = [helper.make_tensor("scale", FLOAT, [], [float(c.scale)]),
              helper.make_tensor("s0", INT64, [1], [0]), helper.make_tensor("s1", INT64, [1], [cap]),
              helper.make_tensor("s2", INT64, [1], [cap + 1]), helper.make_tensor("ax", INT64, [1], [3])]
    graph_nodes = [n("Constant", [], [t.name], value=t) for t in consts] + [
        n("Mul", ["q", "scale"], ["qs"]),
        n("Transpose", ["kb"], ["kbt"], perm=[0, 1, 3, 2]), n("MatMul", ["qs", "kbt"], ["s_buf"]),
        n("Transpose", ["kn"], ["knt"], perm=[0, 1, 3, 2]), n("MatMul", ["qs", "knt"], ["s_new"]),
        n("Concat", ["s_buf", "s_new"], ["s"], axis=-1), n("Add", ["s", "mask"], ["sm"]),
        n("Softmax", ["sm"], ["p"], axis=-1),
        n("Slice", ["p", "s0", "s1", "ax"], ["p_buf"]), n("Slice", ["p", "s1", "s2", "ax"], ["p_new"]),
        n("MatMul", ["p_buf", "vb"], ["y_buf"]), n("MatMul", ["p_new", "vn"], ["y_new"]),
        n("Add", ["y_buf", "y_new"], ["y"])]
    io = [("q", FLOAT, c.q.shape), ("kb", FLOAT, c.k_buf.shape), ("vb", FLOAT, c.v_buf.shape),
          ("kn", FLOAT, c.k_new.shape), ("vn", FLOAT, c.v_new.shape), ("mask", FLOAT, c.mask.shape)]
    graph = session(graph_nodes, io, [("y", FLOAT)], threads)
    feeds = dict(q=c.q, kb=c.k_buf, vb=c.v_buf, kn=c.k_new, vn=c.v_new, mask=c.mask)
    own = lambda y: errors(y, c.exact, c.exact)  # noqa: E731 - the float cache is its own
    out = {"buffer-flavour graph": (lambda: graph.run(None, feeds)[0], c.float_bytes, own)}

    # the two products over the buffer alone (no softmax: probabilities stand in as given)
    probs = np.random.default_rng(1).random((b, h_kv, g, cap), np.float32) / cap
    two = session([n("Transpose", ["kb"], ["kbt"], perm=[0, 1, 3, 2]), n("MatMul", ["q", "kbt"], ["s"]),
                   n("MatMul", ["p", "vb"], ["y"])], [("q", FLOAT, c.q.shape), ("kb", FLOAT, c.k_buf.shape),
                                                      ("p", FLOAT, probs.shape), ("vb", FLOAT, c.v_buf.shape)],
                  [("s", FLOAT), ("y", FLOAT)], threads)
    kt = np.ascontiguousarray(c.k_buf.transpose(0, 1, 3, 2))  # (B, H_kv, d, cap)
    two_t = session([n("MatMul", ["q", "kt"], ["s"]), n("MatMul", ["p", "vb"], ["y"])],
                    [("q", FLOAT, c.q.shape), ("kt", FLOAT, kt.shape), ("p", FLOAT, probs.shape),
                     ("vb", FLOAT, c.v_buf.shape)], [("s", FLOAT), ("y", FLOAT)], threads)
    products = (np.einsum("bhgd,bhtd->bhgt", c.q.astype(np.float64), c.k_buf),  # float64 of the two products
                np.einsum("bhgt,bhtd->bhgd", probs.astype(np.float64), c.v_buf))
    check = lambda got: products_error(got, products)  # noqa: E731
    out["its two cache MatMuls"] = (lambda: two.run(None, dict(q=c.q, kb=c.k_buf, p=probs, vb=c.v_buf)),
                                    c.k_buf.nbytes * 2, check)
    out["keys stored (d, T)"] = (lambda: two_t.run(None, dict(q=c.q, kt=kt, p=probs, vb=c.v_buf)),
                                 c.k_buf.nbytes * 2, check)
    out["GroupQueryAttention"] = gqa_row(c, threads, None)
    out["numpy matmul"] = (lambda: (np.matmul(c.q, c.k_buf.transpose(0, 1, 3, 2)), np.matmul(probs, c.v_buf)),
                           c.k_buf.nbytes * 2, check)
    return out


def products_error(got, products):
    """The two products' largest absolute error, relative to their largest value (the products rows time no
    softmax: their inputs stand in as given)."""
    err = max(np.abs(np.asarray(x, np.float64) - r).max() / np.abs(r).max() for x, r in zip(got, products))
    return f"products {err:.1e}", "-"


def gqa_row(c: Case, threads, bits):
    """onnxruntime's GroupQueryAttention with the buffers shared in place (it writes the new key / value at position
    `filled`): over the float32 cache (bits None) or its own int8 cache (static per-channel scales)."""
    from onnx import helper

    b, h_kv, g, d = c.q.shape
    attrs, ins, cache_type = dict(num_heads=h_kv * g, kv_num_heads=h_kv), [], FLOAT
    arrays = dict(q=np.ascontiguousarray(c.q.reshape(b, 1, -1)), k=np.ascontiguousarray(c.k_new.reshape(b, 1, -1)),
                  v=np.ascontiguousarray(c.v_new.reshape(b, 1, -1)), seqlens_k=np.full((b,), c.filled, np.int32),
                  total=np.array(c.filled + 1, np.int32))
    if bits is None:
        arrays.update(pk=c.k_buf.copy(), pv=c.v_buf.copy())  # its own buffers: it writes into them
        want = c.exact
    else:
        cache_type = INT8
        attrs.update(k_quant_type="PER_CHANNEL", v_quant_type="PER_CHANNEL", kv_cache_bit_width=bits)
        ins = ["", "", "", "", "", "k_scale", "v_scale"]
        deq = {}
        for name, buf, new in (("k", c.k_buf, c.k_new), ("v", c.v_buf, c.v_new)):
            both = with_new(buf, new, c.filled)
            scale = np.maximum(np.abs(both).max((0, 2), keepdims=True) / 127, 1e-30).astype(np.float32)  # (1,H,1,d)
            q8 = np.clip(np.round(buf / scale), -127, 127).astype(np.int8)
            arrays.update({f"p{name}": q8, f"{name}_scale": scale})
            deq[name] = with_new(q8 * scale.astype(np.float64),
                                 np.clip(np.round(new / scale), -127, 127) * scale.astype(np.float64), c.filled)
        want = attention64(c.q, deq["k"], deq["v"])  # it attends to the new token quantized too
    names = ["q", "k", "v", "pk", "pv", "seqlens_k", "total"] + ins
    types = {"seqlens_k": INT32, "total": INT32, "pk": cache_type, "pv": cache_type}
    gqa = session([helper.make_node("GroupQueryAttention", names, ["y", "pk_o", "pv_o"], domain=MS, **attrs)],
                  [(k, types.get(k, FLOAT), list(arrays[k].shape)) for k in names if k],
                  [("y", FLOAT), ("pk_o", cache_type), ("pv_o", cache_type)], threads)
    y = np.empty((b, 1, h_kv * g * d), np.float32)
    bind = gqa.io_binding()
    for name, a in arrays.items():
        bind.bind_input(name, "cpu", 0, a.dtype, list(a.shape), a.ctypes.data)
    for name, a in (("y", y), ("pk_o", arrays["pk"]), ("pv_o", arrays["pv"])):
        bind.bind_output(name, "cpu", 0, a.dtype, list(a.shape), a.ctypes.data)

    def run(keep=arrays):  # the bound arrays live as long as this function (IOBinding holds only pointers)
        gqa.run_with_iobinding(bind)
        return y.reshape(b, h_kv, g, d)  # query head j = kv * G + i, as the grouped layout
    nbytes = c.int8_bytes - 2 * c.k_scale[:, :, :c.filled].nbytes if bits else c.float_bytes
    return run, nbytes, lambda got: errors(got, want, c.exact)


def int8_graph(c: Case, threads, p_digits=PROBABILITY_DIGITS, q_digits=QUERY_DIGITS, float_values=False):
    """The int8 cache graph (paddle_vha/export/int8_attention.py's nodes in the buffer flavour's structure): run, its
    bytes, its check. p_digits / q_digits: the probabilities' / queries' 8-bit digits per row; float_values: the values
    stay float32."""
    cap = c.cap
    nb = Nodes("a")
    qs = nb.op("Mul", ["q", nb.const("scale", c.scale, np.float32)])
    int8_scores(nb, qs, "ku8", "ks", "s_buf", q_digits)
    s_new = nb.op("MatMul", [qs, nb.op("Transpose", ["kn"], perm=[0, 1, 3, 2])])
    p = nb.op("Softmax", [nb.op("Add", [nb.op("Concat", ["s_buf", s_new], axis=-1), "mask"])], axis=-1)
    ax = nb.const("ax", [3], np.int64)
    p_buf = nb.op("Slice", [p, nb.const("s0", [0], np.int64), nb.const("s1", [cap], np.int64), ax])
    p_new = nb.op("Slice", [p, nb.const("s1", [cap], np.int64), nb.const("s2", [cap + 1], np.int64), ax])
    if float_values:
        nb.op("MatMul", [p_buf, "vb"], out="y_buf")
    else:
        int8_values(nb, p_buf, "v8", "vs", "y_buf", p_digits)
    nb.op("Add", ["y_buf", nb.op("MatMul", [p_new, "vn"])], out="y")
    io = [("q", FLOAT, c.q.shape), ("ku8", UINT8, c.ku8.shape), ("ks", FLOAT, c.k_scale.shape),
          ("kn", FLOAT, c.k_new.shape), ("vn", FLOAT, c.v_new.shape), ("mask", FLOAT, c.mask.shape)]
    feeds = dict(q=c.q, ku8=c.ku8, ks=c.k_scale, kn=c.k_new, vn=c.v_new, mask=c.mask)
    if float_values:
        io.append(("vb", FLOAT, c.v_buf.shape))
        feeds["vb"] = c.v_buf
        nbytes = c.int8_bytes // 2 + c.float_bytes // 2
        want = attention64(c.q, with_new(c.k8 * c.k_scale.astype(np.float64), c.k_new, c.filled),
                           with_new(c.v_buf, c.v_new, c.filled))
    else:
        io += [("v8", INT8, c.v8.shape), ("vs", FLOAT, c.v_scale.shape)]
        feeds.update(v8=c.v8, vs=c.v_scale)
        nbytes, want = c.int8_bytes, c.on_int8
    graph = session(nb.nodes, io, [("y", FLOAT)], threads, nb.inits)
    return lambda: graph.run(None, feeds)[0], nbytes, lambda got: errors(got, want, c.exact)


def int8_rows(c: Case, threads):
    from onnx import helper

    b, h_kv, g, d = c.q.shape
    n = helper.make_node
    out = {"int8 cache graph": int8_graph(c, threads)}
    # the two products alone, over given quantized operands: the queries' digits transposed (d, QUERY_DIGITS x G
    # columns, int8, a scale per column) against the keys (uint8, zero point 128, a scale per row), and the
    # probabilities' digits (PROBABILITY_DIGITS x G rows, uint8, zero point 128, a scale per row) against the values
    rng = np.random.default_rng(2)
    q8t = rng.integers(-127, 128, (b, h_kv, d, QUERY_DIGITS * g)).astype(np.int8)
    q_scale = rng.random((b, h_kv, 1, QUERY_DIGITS * g), np.float32)
    digits = rng.integers(1, 256, (b, h_kv, PROBABILITY_DIGITS * g, c.cap)).astype(np.uint8)
    d_scale = rng.random((b, h_kv, PROBABILITY_DIGITS * g, 1), np.float32) / c.cap
    zp = helper.make_tensor("zp", UINT8, [], [128])
    one = helper.make_tensor("one", FLOAT, [], [1.0])
    two = session([n("MatMulIntegerToFloat", ["ku8", "q8t", "ks", "qsc", "zp"], ["s"], domain=MS),
                   n("MatMulIntegerToFloat", ["p8", "v8", "psc", "one", "zp"], ["y"], domain=MS)],
                  [("ku8", UINT8, c.ku8.shape), ("q8t", INT8, q8t.shape), ("ks", FLOAT, c.k_scale.shape),
                   ("qsc", FLOAT, q_scale.shape), ("p8", UINT8, digits.shape), ("v8", INT8, c.v8.shape),
                   ("psc", FLOAT, d_scale.shape)], [("s", FLOAT), ("y", FLOAT)], threads, [zp, one])
    products = (np.einsum("bhtd,bhdg->bhtg", c.k8 * c.k_scale.astype(np.float64), q8t * q_scale.astype(np.float64)),
                np.einsum("bhgt,bhtd->bhgd", (digits.astype(np.float64) - 128) * d_scale, c.v8.astype(np.float64)))
    feeds = dict(ku8=c.ku8, q8t=q8t, ks=c.k_scale, qsc=q_scale, p8=digits, v8=c.v8, psc=d_scale)
    out["its two int8 MatMuls"] = (lambda: two.run(None, feeds), c.int8_bytes,
                                   lambda got: products_error(got, [p.astype(np.float32) for p in products]))
    for n in range(1, PROBABILITY_DIGITS):
        out[f"probabilities in {n} digit{'s' if n > 1 else ''}"] = int8_graph(c, threads, p_digits=n)
    out["queries in 1 digit"] = int8_graph(c, threads, q_digits=1)
    out["int8 keys, float32 values"] = int8_graph(c, threads, float_values=True)
    out["int8 cast, float MatMul"] = cast_row(c, threads)
    out["GroupQueryAttention, int8"] = gqa_row(c, threads, 8)
    return out


def cast_row(c: Case, threads):
    """The int8 cache cast to float32 and scaled (a float copy of it, every step), then the float32 MatMuls."""
    from onnx import helper

    n = helper.make_node
    nodes = [n("Cast", ["k8"], ["kf"], to=FLOAT), n("Mul", ["kf", "ks"], ["k"]), n("Cast", ["v8"], ["vf"], to=FLOAT),
             n("Mul", ["vf", "vs"], ["v"]), n("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
             n("MatMul", ["q", "kt"], ["s"]), n("MatMul", ["p", "v"], ["y"])]
    probs = np.random.default_rng(1).random(c.q.shape[:3] + (c.cap,), np.float32) / c.cap
    graph = session(nodes, [("q", FLOAT, c.q.shape), ("k8", INT8, c.k8.shape), ("ks", FLOAT, c.k_scale.shape),
                            ("p", FLOAT, probs.shape), ("v8", INT8, c.v8.shape), ("vs", FLOAT, c.v_scale.shape)],
                    [("s", FLOAT), ("y", FLOAT)], threads)
    k, v = c.k8 * c.k_scale.astype(np.float64), c.v8 * c.v_scale.astype(np.float64)
    products = (np.einsum("bhgd,bhtd->bhgt", c.q.astype(np.float64), k), np.einsum("bhgt,bhtd->bhgd", probs, v))
    feeds = dict(q=c.q, k8=c.k8, ks=c.k_scale, p=probs, v8=c.v8, vs=c.v_scale)
    return lambda: graph.run(None, feeds), c.int8_bytes, lambda got: products_error(got, products)


def fused_rows(c: Case, threads, caches):
    """{name: (run, bytes, check)}: the fused op of paddle-vha's onnxruntime library (ops/ort, --attention-op fused)
    over the same cache: the new position written into the buffer's spare slot (where the buffer flavour's runtime
    writes it), the rest of the buffer masked."""
    import onnxruntime as ort
    from onnx import helper

    from paddle_vha.serve.ort_ops import DOMAIN, register

    b, h_kv, g, d = c.q.shape
    f = c.filled
    kb, vb = c.k_buf.copy(), c.v_buf.copy()
    kb[:, :, f], vb[:, :, f] = c.k_new[:, :, 0], c.v_new[:, :, 0]
    mask = np.zeros((b, 1, 1, c.cap), np.float32)
    mask[..., f + 1:] = -1e9

    def make(op, names, types, feeds):
        graph = helper.make_graph([helper.make_node(op, names, ["y"], domain=DOMAIN, scale=float(c.scale))], "fused",
                                  [helper.make_tensor_value_info(n, t, feeds[n].shape) for n, t in zip(names, types)],
                                  [helper.make_tensor_value_info("y", FLOAT, None)])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(DOMAIN, 1)])
        opts = ort.SessionOptions()
        opts.log_severity_level = 3
        opts.intra_op_num_threads = threads
        register(opts)
        sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
        return lambda: sess.run(None, feeds)[0]

    out = {}
    if "fp32" in caches:
        feeds = dict(q=c.q, key=kb, value=vb, mask=mask)
        out[("fused DecodeAttention", "fp32")] = (make("DecodeAttention", list(feeds), [FLOAT] * 4, feeds),
                                                  c.float_bytes, lambda y: errors(y, c.exact, c.exact))
    if "int8" in caches:
        k8, ks = quantize(kb)
        v8, vs = quantize(vb)
        feeds = dict(q=c.q, key=(k8.astype(np.int16) + 128).astype(np.uint8), key_scale=ks, value=v8, value_scale=vs,
                     mask=mask)
        want = attention64(c.q, (k8 * ks.astype(np.float64))[:, :, :f + 1], (v8 * vs.astype(np.float64))[:, :, :f + 1])
        out[("fused DecodeAttentionInt8", "int8")] = (
            make("DecodeAttentionInt8", list(feeds), [FLOAT, UINT8, FLOAT, INT8, FLOAT, FLOAT], feeds), c.int8_bytes,
            lambda y: errors(y, want, c.exact))
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
    p.add_argument("--cache", nargs="+", default=["fp32", "int8"], choices=["fp32", "int8"],
                   help="which caches' formulations to time (default both)")
    p.add_argument("--no-fused", dest="fused", action="store_false",
                   help="leave out the fused op's rows (paddle-vha's onnxruntime library, built on first use)")
    args = p.parse_args(argv)
    if min(args.batch, args.context, args.heads, args.kv_heads, args.head_dim, args.threads, args.repeats) < 1:
        p.error("every size must be >= 1")
    if args.heads % args.kv_heads:
        p.error(f"--heads {args.heads} is not a multiple of --kv-heads {args.kv_heads}")
    if args.context < 2:
        p.error("--context must be >= 2 (the sink and at least one other position)")
    cap = args.context + 1  # room for the new position (GroupQueryAttention writes it there)
    # float buffers and the copies GroupQueryAttention, the transposed keys and the reference hold; int8 copies
    need = 4 * args.batch * args.kv_heads * cap * args.head_dim * 2 * 4 + 3 * args.batch * args.kv_heads * cap * (
        args.head_dim + 4) * 2
    free = available_memory_bytes()
    if free is not None and need > free:
        print(f"error: batch {args.batch} x {args.context} positions needs about {need / 1e9:.1f} GB here "
              f"(this machine has {free / 1e9:.1f} GB available)", file=sys.stderr)
        return 2
    g = args.heads // args.kv_heads
    case = Case(*inputs(args.batch, args.kv_heads, g, args.head_dim, cap, args.context), args.context)
    bandwidth = read_bandwidth()
    rows = []
    forms = {}
    if "fp32" in args.cache:
        forms.update({(n, "fp32"): r for n, r in float_rows(case, args.threads).items()})
    if "int8" in args.cache:
        forms.update({(n, "int8"): r for n, r in int8_rows(case, args.threads).items()})
    if args.fused:
        forms.update(fused_rows(case, args.threads, args.cache))
    for (name, cache), (run, nbytes, check) in forms.items():
        err, err_float = check(run())
        times = []
        for _ in range(args.repeats):
            t = time.perf_counter()
            run()
            times.append(time.perf_counter() - t)
        rows.append((name, cache, float(np.median(times)), nbytes, err, err_float))
    bandwidth = (bandwidth + read_bandwidth()) / 2
    print(f"{cpu_line()}; load average {os.getloadavg()[0]:.1f}; {args.threads} threads; read bandwidth "
          f"{bandwidth / 1e9:.1f} GB/s; one layer: batch {args.batch}, {args.heads} query heads over {args.kv_heads} "
          f"cached heads of {args.head_dim}, {args.context} cached positions ({case.float_bytes / 1e6:.0f} MB of "
          f"float32 keys + values, {case.int8_bytes / 1e6:.0f} MB int8 with their scales); sink mass "
          f"{case.sink_mass:.2f}; floor = a row's cache bytes / read bandwidth")
    hdr = (f"{'formulation':<28} | {'cache':<5} | {'ms':>8} | {'GB/s':>6} | {'x floor':>7} | {'err':>16} | "
           f"{'err vs float cache':>18}")
    print(hdr)
    print("-" * len(hdr))
    for name, cache, t, nbytes, err, err_float in rows:
        floor = nbytes / bandwidth
        print(f"{name:<28} | {cache:<5} | {t * 1e3:>8.2f} | {nbytes / t / 1e9:>6.2f} | {t / floor:>6.2f}x | "
              f"{err:>16} | {err_float:>18}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
