"""The ONNX nodes of attention over an int8 KV cache (paddle_vha/export/kv_cache.py rewrites the exported graph with
them; tools/bench_attention_cpu.py times the same nodes).

The cache, per layer (scales: per token and KV head, float32, symmetric: the token's largest |value| / 127):

    keys         uint8 (B, H_kv, T, d)   round(k / scale) + 128 (zero point 128: the u8 operand, below)
    key_scale    float (B, H_kv, T, 1)
    values       int8  (B, H_kv, T, d)   round(v / scale)
    value_scale  float (B, H_kv, T, 1)

Positions are axis 2 of every tensor, as in the float32 cache: a step writes only its new tokens' rows (the buffer
flavour's runtime writes them in place).

What attention runs (onnxruntime's contrib op MatMulIntegerToFloat, com.microsoft, for both products; the rest
standard ONNX), each product reading the int8 cache as it lies, int8 dot products summed in int32, scales applied to
the output, no float copy of the cache made:

- scores^T = keys . q^T: the cache is the left operand (uint8 rows; their scales multiply the scores after the
  product), the queries the right one (a few columns: G = H / H_kv per cached head, times the new tokens).
  onnxruntime packs its right operand on every call when it is not a constant, and its u8 x s8 kernels are the fast
  ones: with the keys on the left the product ran 3.2x faster than with them transposed on the right (1 thread,
  batch 8, 16K positions: 4.0 vs 12.7 ms), so the keys are stored uint8 and the (T, R) scores transposed back (one
  pass over R x T floats);
- y = p . values: the values' per-token scales fold into the probabilities (p' = p * value_scale, over columns), the
  values are the right operand.

The small operands (queries, probabilities) are quantized per row in several 8-bit digits (`digits`): digit 1
round(x / s), s = the row's largest |x| / 127, each next digit the remainder on a 254x finer grid, stacked as rows of
the same product and summed after it. Queries: 2 digits (one 8-bit digit put 1.7e-2 relative error on a peaked toy
model's logits, against 4e-5). Probabilities: 3 digits: attention rows span orders of magnitude (a sink token near
1, thousands of others near 1e-4 that carry much of the output), and a grid relative to the row's largest value
rounds the small ones to zero: one digit was off by 29%, two by 3% at 16K positions with a sink holding half the
mass, three by 4e-6 (tools/bench_attention_cpu.py, numpy).
"""
from __future__ import annotations

from typing import List, Tuple

import numpy as np

__all__ = ["Nodes", "quantize_rows", "encode", "digits", "int8_scores", "int8_values", "MS", "TINY", "QUERY_DIGITS",
           "PROBABILITY_DIGITS", "KEY_ZERO_POINT"]

MS = "com.microsoft"
TINY = 1e-30  # a row of zeros gets this scale (its values quantize to 0), not a division by zero
KEY_ZERO_POINT = 128  # the keys are stored uint8: round(k / scale) + 128
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


def _row_scale(nb: Nodes, x: str, nonnegative: bool = False) -> str:
    """x (B, H, R, C) -> (B, H, R, 1): the row's largest |x| / 127 (TINY for a row of zeros)."""
    mag = nb.op("ReduceMax", [x if nonnegative else nb.op("Abs", [x])], axes=[-1], keepdims=1)
    return nb.op("Max", [nb.op("Div", [mag, nb.const("c127", 127.0, np.float32)]), nb.const("tiny", TINY, np.float32)],
                 tag="scale")


def _row_quantizer(nb: Nodes, x: str, scale: str, zero_point: int, dtype):
    """(x (B, H, R, C) seen as (B*H*R, C) rows, the flat scale (B*H*R,), the zero points (B*H*R,)): the standard
    QuantizeLinear / DequantizeLinear's per-axis form then gives each row its own scale."""
    from onnx import helper

    rows = nb.op("Flatten", [x], axis=3)  # (B*H*R, C): a view, no copy
    flat_scale = nb.op("Reshape", [scale, nb.const("minus1", [-1], np.int64)])  # (B*H*R,)
    zp_value = helper.make_tensor("zp", helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), [1], [zero_point])
    zp = nb.op("ConstantOfShape", [nb.op("Shape", [flat_scale])], value=zp_value)  # (B*H*R,) of zero_point
    return rows, flat_scale, zp


def quantize_rows(nb: Nodes, x: str, zero_point: int, dtype) -> Tuple[str, str]:
    """x (B, H, R, C) float -> (round(x / s) + zero_point per row, saturated, of `dtype` (np.int8 / np.uint8),
    (B, H, R, C); s (B, H, R, 1), the row's largest |x| / 127)."""
    scale = _row_scale(nb, x)
    rows, flat_scale, zp = _row_quantizer(nb, x, scale, zero_point, dtype)
    q = nb.op("QuantizeLinear", [rows, flat_scale, zp], axis=0)  # (B*H*R, C)
    return nb.op("Reshape", [q, nb.op("Shape", [x])]), scale  # (B, H, R, C)


def encode(nb: Nodes, x: str, keys: bool) -> Tuple[str, str]:
    """New cache entries x (B, H, S, d) float -> (their 8-bit entries (B, H, S, d): uint8 with zero point
    KEY_ZERO_POINT for keys, int8 for values; their scales (B, H, S, 1) float)."""
    return quantize_rows(nb, x, KEY_ZERO_POINT, np.uint8) if keys else quantize_rows(nb, x, 0, np.int8)


def digits(nb: Nodes, x: str, n: int, zero_point: int = 0, dtype=np.int8, nonnegative: bool = False
           ) -> Tuple[str, str]:
    """x (B, H, R, C) float in `n` 8-bit digits per row: (the digits (B, H, nR, C) of `dtype` with `zero_point`, the
    first digit's R rows, then the second's, ...; their scales (B, H, nR, 1)). Digit 1 is round(x / s) with s the
    row's largest |x| / 127; digit k + 1 is the remainder x - (what digits 1..k hold), |.| <= s / (2 * 254^(k-1)),
    on a grid 254x finer than digit k's. n digits hold x to about 8n - 1 bits of the row's largest value.
    nonnegative: x >= 0 (no |x| pass)."""
    scale = _row_scale(nb, x, nonnegative)
    shape = nb.op("Shape", [x])
    rows, flat, zp = _row_quantizer(nb, x, scale, zero_point, dtype)  # (B*H*R, C), (B*H*R,) twice
    rest, out, scales = rows, [], [scale]
    for k in range(n):
        if k:
            scales.append(nb.op("Div", [scales[-1], nb.const("c254", 254.0, np.float32)]))  # (B, H, R, 1)
            flat = nb.op("Reshape", [scales[-1], nb.const("minus1", [-1], np.int64)])
        digit = nb.op("QuantizeLinear", [rest, flat, zp], axis=0)  # (B*H*R, C), within +-127 of the zero point
        if k < n - 1:
            rest = nb.op("Sub", [rest, nb.op("DequantizeLinear", [digit, flat, zp], axis=0)])
        out.append(nb.op("Reshape", [digit, shape]))
    cat = (lambda xs, axis: xs[0] if len(xs) == 1 else nb.op("Concat", xs, axis=axis))  # noqa: E731
    return cat(out, 2), cat(scales, 2)  # (B, H, nR, C), (B, H, nR, 1)


def _sum_parts(nb: Nodes, x: str, n: int, axis: int, out: str = None) -> str:
    """x (B, H, nR, N) (axis 2) or (B, H, N, nR) (axis 3) -> the sum of its n blocks of R along that axis: one read of
    x, a reshape splitting the axis into (n, R) then ReduceSum over the n."""
    shape = nb.op("Shape", [x])  # (4,)
    head = nb.op("Slice", [shape, nb.const("i0", [0], np.int64), nb.const("ia", [axis], np.int64)])
    tail = nb.op("Slice", [shape, nb.const("ib", [axis + 1], np.int64), nb.const("i4", [4], np.int64)])
    split = nb.op("Concat", [head, nb.const("parts", [n, -1], np.int64), tail], axis=0)  # e.g. (B, H, n, -1, N)
    return nb.op("ReduceSum", [nb.op("Reshape", [x, split]), nb.const("axis", [axis], np.int64)], keepdims=0, out=out)


def int8_scores(nb: Nodes, q: str, keys: str, key_scale: str, out: str, n: int = QUERY_DIGITS) -> str:
    """q (B, H, R, d) float times the cache's keys (B, H, T, d) uint8 with key_scale (B, H, T, 1) -> `out`
    (B, H, R, T) float: keys . q^T with the queries in `n` 8-bit digits per row (the digits' column blocks split and
    added: 1 thread, batch 8, 16K positions, 3.5 ms, against 5.1 for interleaved digits summed by ReduceSum over the
    innermost axis and 36 for a ReduceSum over a middle axis), transposed (R is small: a fast transpose), then times
    the keys' scales along T. The keys' scales are not MatMulIntegerToFloat's a_scale: a per-row a_scale costs
    onnxruntime an extra pass over the (T, nR) product (2 threads, batch 8 / 16K: 4.76 ms for these nodes against
    3.13 with the scales on the (R, T) scores)."""
    q8, q_scales = digits(nb, q, n)  # (B, H, nR, d) int8, (B, H, nR, 1)
    q8t = nb.op("Transpose", [q8], perm=[0, 1, 3, 2])  # (B, H, d, nR): small
    q_scales_t = nb.op("Transpose", [q_scales], perm=[0, 1, 3, 2])  # (B, H, 1, nR)
    s_t = nb.op("MatMulIntegerToFloat", [keys, q8t, nb.const("one", 1.0, np.float32), q_scales_t,
                                         nb.const("zp", KEY_ZERO_POINT, np.uint8)], domain=MS)  # (B, H, T, nR)
    if n > 1:
        s_t = nb.op("Sum", list(nb.op("Split", [s_t], outputs=n, axis=3)))  # (B, H, T, R)
    s = nb.op("Transpose", [s_t], perm=[0, 1, 3, 2])  # (B, H, R, T)
    scale_row = nb.op("Transpose", [key_scale], perm=[0, 1, 3, 2], tag="key_scale_row")  # (B, H, 1, T)
    return nb.op("Mul", [s, scale_row], out=out)  # (B, H, R, T)


def int8_values(nb: Nodes, p: str, values: str, value_scale: str, out: str, n: int = PROBABILITY_DIGITS) -> str:
    """Probabilities p (B, H, R, T) float times the cache's values (B, H, T, d) int8 with value_scale (B, H, T, 1) ->
    `out` (B, H, R, d) float: p' = p * value_scale in `n` 8-bit digits per row (the module docstring)."""
    shape = nb.op("Shape", [value_scale])  # (B, H, T, 1)
    row_shape = nb.op("Concat", [nb.op("Slice", [shape, nb.const("i0", [0], np.int64), nb.const("i2", [2], np.int64)]),
                                 nb.const("one_t", [1, -1], np.int64)], axis=0)  # (B, H, 1, T)
    pv = nb.op("Mul", [p, nb.op("Reshape", [value_scale, row_shape])])  # (B, H, R, T): p' >= 0
    p8, scales = digits(nb, pv, n, 128, np.uint8, nonnegative=True)  # (B, H, nR, T) uint8 (zp 128), (B, H, nR, 1)
    products = nb.op("MatMulIntegerToFloat", [p8, values, scales, nb.const("one", 1.0, np.float32),
                                              nb.const("zp", 128, np.uint8)], domain=MS, out=None if n > 1 else out)
    return _sum_parts(nb, products, n, 2, out) if n > 1 else products  # (B, H, R, d)
