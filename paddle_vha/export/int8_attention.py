"""The ONNX nodes of attention over an int8 KV cache (paddle_vha/export/kv_cache.py rewrites the exported graph with
them; tools/bench_attention_cpu.py times the same nodes).

The cache, per layer and KV head (scales: per token and KV head, float32, symmetric, the token's largest |value| / 127):

    keys         int8  (B, H_kv, d, T)   stored transposed, so the query-key product reads them as they lie
    key_scale    float (B, H_kv, 1, T)
    values       int8  (B, H_kv, T, d)
    value_scale  float (B, H_kv, 1, T)

Every tensor's positions are its last axis but the values', so a step writes only its new tokens' bytes: a column
of the keys and the scales, rows of the values (the buffer flavour's runtime writes them in place).

What attention runs (onnxruntime's contrib op MatMulIntegerToFloat, com.microsoft, both products; the rest standard
ONNX):

- scores = q . keys: the queries (a few rows: G = H / H_kv per cached head, times the new tokens) quantized per row to
  8 bits (uint8 with zero point 128: onnxruntime's u8 x s8 kernels, several times faster here than its s8 x s8), then
  MatMulIntegerToFloat(q8, keys, q_scale per row, key_scale per column): the int8 dot products in int32, both scales
  applied on the output, so no float copy of the cache is made;
- y = p . values: the values' per-token scales fold into the probabilities (p' = p * value_scale, over columns), and
  p' is quantized per row to two 8-bit digits (hi = round(p' / s), then the remainder on a 254x finer grid), stacked as
  2G rows of one MatMulIntegerToFloat, so the values are read once and p' keeps about 15 bits. One digit is not
  enough: attention rows span orders of magnitude (a sink token near 1, thousands of others near 1e-4, most of the
  output), and 8 bits per row round the small ones to zero: tools/bench_attention_cpu.py measures 8-bit probabilities
  off by tens of percent where a sink holds the mass, the two digits by ~1e-3.
"""
from __future__ import annotations

from typing import List, Tuple

import numpy as np

__all__ = ["Nodes", "quantize_rows", "encode", "int8_scores", "int8_values", "MS", "TINY"]

MS = "com.microsoft"
TINY = 1e-30  # a row of zeros gets this scale (its values quantize to 0), not a division by zero
QUERY_DIGITS = 2  # the queries' 8-bit digits per row in the keys' product (int8_scores)
PROBABILITY_DIGITS = 3  # the probabilities' (times the value scales) in the values' product (int8_values)


class Nodes:
    """ONNX nodes and their constants built under one name prefix (`<prefix>.<tag>`, unique within the prefix)."""

    def __init__(self, prefix: str):
        self.prefix = prefix
        self.nodes: List = []
        self.inits: List = []
        self._count = 0

    def name(self, tag: str) -> str:
        self._count += 1
        return f"{self.prefix}.{tag}.{self._count}"

    def op(self, op_type: str, inputs, tag: str = None, outputs: int = 1, out=None, domain: str = "", **attrs):
        """Adds the node; returns its output name (or names, for outputs > 1). `out` names the (first) output."""
        from onnx import helper

        names = [out if (k == 0 and out) else self.name(f"{tag or op_type.lower()}{'' if k == 0 else k}")
                 for k in range(outputs)]
        self.nodes.append(helper.make_node(op_type, list(inputs), names, name=self.name(op_type), domain=domain,
                                           **attrs))
        return names[0] if outputs == 1 else names

    def const(self, tag: str, value, dtype) -> str:
        """A constant (an initializer) holding `value` as `dtype`, shape as given (a scalar for a number)."""
        from onnx import numpy_helper

        name = self.name(tag)
        self.inits.append(numpy_helper.from_array(np.asarray(value, dtype), name))
        return name


def quantize_rows(nb: Nodes, x: str, qmax: float, zero_point: int, dtype) -> Tuple[str, str]:
    """x (B, H, R, C) float -> (x quantized per row: round(x / scale) + zero_point, saturated, of `dtype` (np.int8 or
    np.uint8), (B, H, R, C); scale (B, H, R, 1) float = the row's largest |x| / qmax)."""
    mag = nb.op("ReduceMax", [nb.op("Abs", [x])], axes=[-1], keepdims=1)  # (B, H, R, 1)
    scale = nb.op("Max", [nb.op("Div", [mag, nb.const("qmax", qmax, np.float32)]), nb.const("tiny", TINY, np.float32)],
                  tag="scale")
    return _quantize_per_row(nb, x, scale, zero_point, dtype), scale


def _row_quantizer(nb: Nodes, x: str, scale: str, zero_point: int, dtype):
    """(x (B, H, R, C) seen as (B*H*R, C) rows, the flat scale (B*H*R,), the zero points (B*H*R,)): the standard
    QuantizeLinear / DequantizeLinear's per-axis form then gives each row its own scale."""
    from onnx import helper

    rows = nb.op("Flatten", [x], axis=3)  # (B*H*R, C): a view, no copy
    flat_scale = nb.op("Reshape", [scale, nb.const("minus1", [-1], np.int64)])  # (B*H*R,)
    zp_value = helper.make_tensor("zp", helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), [1], [zero_point])
    zp = nb.op("ConstantOfShape", [nb.op("Shape", [flat_scale])], value=zp_value)  # (B*H*R,) of zero_point
    return rows, flat_scale, zp


def _quantize_per_row(nb: Nodes, x: str, scale: str, zero_point: int, dtype) -> str:
    """round(x / scale) + zero_point, saturated, per row of x (B, H, R, C) with scale (B, H, R, 1)."""
    rows, flat_scale, zp = _row_quantizer(nb, x, scale, zero_point, dtype)
    q = nb.op("QuantizeLinear", [rows, flat_scale, zp], axis=0)  # (B*H*R, C)
    return nb.op("Reshape", [q, nb.op("Shape", [x])])  # (B, H, R, C)


def encode(nb: Nodes, x: str, transposed: bool) -> Tuple[str, str]:
    """New cache entries x (B, H, S, d) float -> (int8 entries: (B, H, d, S) if transposed (keys) else (B, H, S, d),
    their scales (B, H, 1, S) float)."""
    q, scale = quantize_rows(nb, x, 127.0, 0, np.int8)  # (B, H, S, d), (B, H, S, 1)
    if transposed:
        q = nb.op("Transpose", [q], perm=[0, 1, 3, 2])  # (B, H, d, S)
    return q, nb.op("Transpose", [scale], perm=[0, 1, 3, 2])  # (B, H, 1, S)


def digits(nb: Nodes, x: str, scale: str, n: int) -> Tuple[str, str]:
    """x (B, H, R, C) float in `n` 8-bit digits per row: (the digits (B, H, nR, C) uint8 with zero point 128, the
    first digit's R rows, then the second's, ...; their scales (B, H, nR, 1)). Digit 1 is round(x / s) + 128 with
    s = `scale` (B, H, R, 1), the row's largest |x| / 127; digit k + 1 is the remainder x - (what digits 1..k hold),
    |.| <= s / (2 * 254^(k-1)), on a grid 254x finer than digit k's. n digits hold x to about 8n - 1 bits of the row's
    largest value."""
    shape = nb.op("Shape", [x])
    rows, flat, zp = _row_quantizer(nb, x, scale, 128, np.uint8)  # (B*H*R, C), (B*H*R,) twice
    rest, out, scales = rows, [], [scale]
    for k in range(n):
        if k:
            scales.append(nb.op("Div", [scales[-1], nb.const("c254", 254.0, np.float32)]))  # (B, H, R, 1)
            flat = nb.op("Reshape", [scales[-1], nb.const("minus1", [-1], np.int64)])
        digit = nb.op("QuantizeLinear", [rest, flat, zp], axis=0)  # (B*H*R, C), in 1..255
        if k < n - 1:
            rest = nb.op("Sub", [rest, nb.op("DequantizeLinear", [digit, flat, zp], axis=0)])
        out.append(nb.op("Reshape", [digit, shape]))
    return nb.op("Concat", out, axis=2), nb.op("Concat", scales, axis=2)  # (B, H, nR, C), (B, H, nR, 1)


def _sum_parts(nb: Nodes, x: str, n: int, out: str) -> str:
    """x (B, H, nR, N) -> the sum of its n blocks of R rows, (B, H, R, N): one read of x (a reshape to
    (B, H, n, R, N), then ReduceSum over the n)."""
    shape = nb.op("Shape", [x])  # (4,)
    split = nb.op("Concat", [nb.op("Slice", [shape, nb.const("i0", [0], np.int64), nb.const("i2", [2], np.int64)]),
                             nb.const("parts", [n, -1], np.int64),
                             nb.op("Slice", [shape, nb.const("i3", [3], np.int64), nb.const("i4", [4], np.int64)])],
                  axis=0)  # (B, H, n, -1, N)
    return nb.op("ReduceSum", [nb.op("Reshape", [x, split]), nb.const("axis2", [2], np.int64)], keepdims=0,
                 out=out)


def int8_scores(nb: Nodes, q: str, keys: str, key_scale: str, out: str, n: int = QUERY_DIGITS) -> str:
    """q (B, H, R, d) float times int8 keys (B, H, d, T) with key_scale (B, H, 1, T) -> `out` (B, H, R, T) float.
    The queries in `n` 8-bit digits per row (`digits`), the products of the n blocks of rows summed."""
    mag = nb.op("ReduceMax", [nb.op("Abs", [q])], axes=[-1], keepdims=1)  # (B, H, R, 1)
    scale = nb.op("Max", [nb.op("Div", [mag, nb.const("c127", 127.0, np.float32)]),
                          nb.const("tiny", TINY, np.float32)])
    zp = nb.const("zp128", 128, np.uint8)
    if n == 1:
        return nb.op("MatMulIntegerToFloat", [_quantize_per_row(nb, q, scale, 128, np.uint8), keys, scale, key_scale,
                                              zp], out=out, domain=MS)
    q8, scales = digits(nb, q, scale, n)  # (B, H, nR, d), (B, H, nR, 1)
    return _sum_parts(nb, nb.op("MatMulIntegerToFloat", [q8, keys, scales, key_scale, zp], domain=MS), n, out)


def int8_values(nb: Nodes, p: str, values: str, value_scale: str, out: str, n: int = PROBABILITY_DIGITS) -> str:
    """Probabilities p (B, H, R, T) float times int8 values (B, H, T, d) with value_scale (B, H, 1, T) -> `out`
    (B, H, R, d) float: p' = p * value_scale in `n` 8-bit digits per row (the module docstring)."""
    pv = nb.op("Mul", [p, value_scale])  # (B, H, R, T): p' = p * value scale, per column; p' >= 0
    mag = nb.op("ReduceMax", [pv], axes=[-1], keepdims=1)  # (B, H, R, 1)
    scale = nb.op("Max", [nb.op("Div", [mag, nb.const("c127", 127.0, np.float32)]),
                          nb.const("tiny", TINY, np.float32)])
    p8, scales = digits(nb, pv, scale, n)  # (B, H, nR, T), (B, H, nR, 1)
    products = nb.op("MatMulIntegerToFloat", [p8, values, scales, nb.const("one", 1.0, np.float32),
                                              nb.const("zp128", 128, np.uint8)], domain=MS)  # (B, H, nR, d)
    return _sum_parts(nb, products, n, out)
