"""Block quantization of a weight into onnxruntime's MatMulNBits / GatherBlockQuantized layout, in numpy.

A weight W (K, N) (a MatMul's right operand: K inputs, N outputs) is cut, per output column n, into blocks of `block`
consecutive inputs; block j of column n holds codes q in [0, 2^bits - 1], a float32 scale s and an integer zero
point z, and stands for

    W[j*block + i, n] ~= s[n, j] * (q[n, j, i] - z[n, j])

(MatMulNBits' own dequantization; without zero points onnxruntime reads z = 2^(bits-1), the symmetric form). An
integer z is what keeps MatMulNBits on its int8 kernels: a float zero point is accepted by onnxruntime 1.32 but its
CPU kernel then falls back to float compute, ~35x slower a step (measured, docs/deploy.md).

How the codes, scales and zero points are chosen is the recipe (`Recipe`):

    symmetric  z = 2^(bits-1), s = the block's largest |w| / (2^(bits-1) - 1) ... as llama.cpp's Q4_0 / Q8_0 rule
               (the sign of the largest |w| kept: q in [-8, 7] for 4 bits reaches -8 at the extreme)
    asymmetric s = (max - min) / (2^bits - 1), z = round(-min / s): the block's range on the whole grid
    search     a set of candidate scales around the recipe's start; for each, codes by rounding, then the scale (and,
               asymmetric, the minimum, rounded to an integer zero point) refit by least squares to those codes,
               the codes rounded again; the candidate with the smallest (weighted) squared error of the block wins.
               The refit is llama.cpp's make_qkx2_quants idea; the integer zero point is MatMulNBits' constraint.
    weighted   the squared error of each input k weighted by an importance: the mean square of the activation x_k
               that multiplies it, measured on calibration text (what llama.cpp's imatrix and AWQ measure): an error
               on an input that is large at run time costs more of the output.

Blocks are quantized a column chunk at a time (blocks never cross columns), so memory stays at the chunk's size.
A K that is not a multiple of `block` pads its last block with zeros that carry no weight in any fit.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

import numpy as np

__all__ = ["Recipe", "QuantizedBlocks", "quantize_blocks", "pack_codes", "pack_zero_points", "RECIPES"]


@dataclass(frozen=True)
class Recipe:
    """How a block's codes, scale and zero point are chosen (see the module docstring)."""

    name: str
    asymmetric: bool
    search: bool
    weighted: bool  # uses activation importances when given

    def describe(self) -> str:
        form = "asymmetric (uint8 zero points)" if self.asymmetric else "symmetric"
        how = "scale search + least-squares refit" if self.search else "round to nearest"
        return f"{form}, {how}" + (", activation-weighted" if self.weighted else "")


RECIPES = {
    "rtn": Recipe("rtn", asymmetric=False, search=False, weighted=False),  # onnxruntime's own (the old default)
    "symsearch": Recipe("symsearch", asymmetric=False, search=True, weighted=False),  # the search without zero points
    "asym": Recipe("asym", asymmetric=True, search=False, weighted=False),
    "search": Recipe("search", asymmetric=True, search=True, weighted=False),
    "awq": Recipe("awq", asymmetric=True, search=True, weighted=True),
}
SEARCH_STEPS = np.linspace(-1.0, 1.0, 11)  # candidate inverse scales: (levels + step) / range, as make_qkx2_quants
REFIT_ROUNDS = 2  # least-squares refits per candidate (codes -> scale / zero point -> codes)
FIT_DTYPE = np.float32  # the fits' arithmetic: float64 halves the speed for no measurable change in the error


@dataclass
class QuantizedBlocks:
    """codes (N, n_blocks, block) uint8 in [0, 2^bits); scales (N, n_blocks) float32; zero_points (N, n_blocks)
    uint8, or None for the symmetric form (z = 2^(bits-1))."""

    codes: np.ndarray
    scales: np.ndarray
    zero_points: Optional[np.ndarray]
    bits: int
    block: int
    k: int  # the weight's K (the last block may be padded past it)

    def dequantize(self) -> np.ndarray:
        """(K, N) float64: what MatMulNBits multiplies by."""
        z = (self.zero_points.astype(np.float64) if self.zero_points is not None
             else np.full(self.scales.shape, 2 ** (self.bits - 1), np.float64))
        w = (self.codes.astype(np.float64) - z[..., None]) * self.scales.astype(np.float64)[..., None]
        return w.reshape(w.shape[0], -1)[:, :self.k].T


def _blocks(w: np.ndarray, block: int) -> Tuple[np.ndarray, np.ndarray]:
    """(x (N, n_blocks, block) FIT_DTYPE, mask (n_blocks, block) of real entries): the columns of w (K, N) in
    blocks."""
    k, n = w.shape
    nb = -(-k // block)
    x = np.zeros((n, nb * block), FIT_DTYPE)
    x[:, :k] = w.T
    mask = np.zeros(nb * block, bool)
    mask[:k] = True
    return x.reshape(n, nb, block), mask.reshape(nb, block)


def _fit_symmetric(x, wt, levels_lo, levels_hi, search):
    """Symmetric codes: (q signed (.., block) float64, scale (..)) minimising sum wt (x - s q)^2."""
    amax_idx = np.abs(x).argmax(-1)[..., None]
    extreme = np.take_along_axis(x, amax_idx, -1)[..., 0]  # the block's value of largest |x|, with its sign
    base = np.where(extreme != 0, extreme / levels_lo, 1.0)  # llama.cpp's Q4_0: the extreme maps to the -8 end
    if not search:
        q = np.clip(np.rint(x / base[..., None]), levels_lo, levels_hi)
        return q, np.where(extreme != 0, base, 0.0)
    s0 = np.where(extreme != 0, base, 1.0)  # the round-to-nearest fit is a candidate: the search never loses to it
    best_q = np.clip(np.rint(x / s0[..., None]), levels_lo, levels_hi)
    best_s, best_err = s0, (wt * (x - s0[..., None] * best_q) ** 2).sum(-1)
    for step in SEARCH_STEPS:
        s = np.where(extreme != 0, extreme / (levels_lo - step * 0.5), 1.0)
        q = np.clip(np.rint(x / s[..., None]), levels_lo, levels_hi)
        for _ in range(REFIT_ROUNDS):
            den = (wt * q * q).sum(-1)
            s = np.where(den > 0, (wt * q * x).sum(-1) / np.where(den > 0, den, 1), s)
            s = np.where(s == 0, 1.0, s)
            q = np.clip(np.rint(x / s[..., None]), levels_lo, levels_hi)
        err = (wt * (x - s[..., None] * q) ** 2).sum(-1)
        better = err < best_err
        best_q = np.where(better[..., None], q, best_q)
        best_s, best_err = np.where(better, s, best_s), np.minimum(err, best_err)
    zero = (x == 0).all(-1)
    return best_q, np.where(zero, 0.0, best_s)


def _fit_asymmetric(x, wt, mask, levels, search):
    """Asymmetric codes: (q (.., block) float64 in [0, levels], scale (..), zero point (..) integer) minimising
    sum wt (x - s (q - z))^2 with z an integer in [0, levels]."""
    big = np.finfo(x.dtype).max
    lo = np.where(mask, x, big).min(-1)
    hi = np.where(mask, x, -big).max(-1)
    lo, hi = np.minimum(lo, 0.0), np.maximum(hi, 0.0)  # the grid holds 0 exactly (a zero weight stays zero)
    span = hi - lo
    flat = span <= 0
    span = np.where(flat, 1.0, span)

    def codes(s, z):
        return np.clip(np.rint(x / s[..., None]) + z[..., None], 0, levels)

    def finish(q, s, z):
        return q, np.where(flat, 1.0, s), np.where(flat, 0.0, z)

    s = span / levels
    z = np.clip(np.rint(-lo / s), 0, levels)
    q = codes(s, z)
    if not search:
        return finish(q, s, z)
    # the round-to-nearest fit is a candidate: the search never loses to it
    best = [q, s, z, (wt * (x - s[..., None] * (q - z[..., None])) ** 2).sum(-1)]
    for step in SEARCH_STEPS:
        iscale = (levels + step) / span
        q = np.clip(np.rint((x - lo[..., None]) * iscale[..., None]), 0, levels)
        for _ in range(REFIT_ROUNDS):
            # least squares of x ~ s q + m over the block (weights wt), then m rounded to -s z with z an integer
            sw, sq, sx = wt.sum(-1), (wt * q).sum(-1), (wt * x).sum(-1)
            sqq, sqx = (wt * q * q).sum(-1), (wt * q * x).sum(-1)
            det = sw * sqq - sq * sq
            ok = det > 1e-30
            s = np.where(ok, (sw * sqx - sq * sx) / np.where(ok, det, 1), span / levels)
            m = np.where(ok, (sqq * sx - sq * sqx) / np.where(ok, det, 1), lo)
            s = np.where(s > 0, s, span / levels)
            z = np.clip(np.rint(-m / s), 0, levels)
            qz = q - z[..., None]  # with z fixed: the scale's own least squares
            den = (wt * qz * qz).sum(-1)
            s = np.where(den > 0, (wt * qz * x).sum(-1) / np.where(den > 0, den, 1), s)
            s = np.where(s > 0, s, span / levels)
            q = codes(s, z)
        err = (wt * (x - s[..., None] * (q - z[..., None])) ** 2).sum(-1)
        better = err < best[3]
        best = [np.where(better[..., None], q, best[0]), np.where(better, s, best[1]),
                np.where(better, z, best[2]), np.minimum(err, best[3])]
    return finish(*best[:3])


def quantize_blocks(w: np.ndarray, bits: int, block: int, recipe: Recipe,
                    importance: Optional[np.ndarray] = None, chunk_values: int = 1 << 16) -> QuantizedBlocks:
    """w (K, N) float -> QuantizedBlocks by `recipe`. importance (K,): per-input weights of the squared error (used
    when recipe.weighted; e.g. E[x_k^2] on calibration text); chunk_values: values fitted at a time (64K: the
    temporaries stay in cache; 4M was 1.7x slower on a 151,936 x 1,024 head)."""
    assert bits in (4, 8), f"bits {bits}: MatMulNBits on CPU takes 4 or 8"
    assert w.ndim == 2, f"a weight is (K, N), got shape {w.shape}"
    k, n = w.shape
    nb = -(-k // block)
    levels = 2 ** bits - 1
    imp = np.ones(nb * block, FIT_DTYPE)
    if recipe.weighted and importance is not None:
        assert importance.shape == (k,), f"importance has shape {importance.shape}, expected ({k},)"
        imp_k = np.asarray(importance, np.float64)
        imp[:k] = imp_k / max(float(imp_k.mean()), 1e-30) + 1e-3  # mean 1; no input weighs nothing
    imp[k:] = 0.0  # padding carries no weight
    wt_blocks = imp.reshape(nb, block)
    codes = np.empty((n, nb, block), np.uint8)
    scales = np.empty((n, nb), np.float32)
    zeros = np.empty((n, nb), np.uint8) if recipe.asymmetric else None
    step = max(1, chunk_values // (nb * block))
    for c in range(0, n, step):
        x, mask = _blocks(np.asarray(w[:, c:c + step]), block)  # (n_c, nb, block)
        wt = np.broadcast_to(wt_blocks, x.shape)
        if recipe.asymmetric:
            q, s, z = _fit_asymmetric(x, wt, mask, levels, recipe.search)
            zeros[c:c + step] = z.astype(np.uint8)
        else:
            half = 2 ** (bits - 1)
            q, s = _fit_symmetric(x, wt, -half, half - 1, recipe.search)
            q = q + half
        q = np.where(mask, q, (zeros[c:c + step][..., None] if recipe.asymmetric else 2 ** (bits - 1)))
        codes[c:c + step] = q.astype(np.uint8)
        scales[c:c + step] = s.astype(np.float32)
    return QuantizedBlocks(codes, scales, zeros, bits, block, k)


def pack_codes(qb: QuantizedBlocks) -> np.ndarray:
    """(N, n_blocks, block * bits / 8) uint8: MatMulNBits' B (4 bits: two codes a byte, the first in the low
    nibble); the same bytes, read as (N, K / 2), are GatherBlockQuantized's data for an embedding table."""
    if qb.bits == 8:
        return qb.codes
    c = qb.codes
    return (c[..., 0::2] | (c[..., 1::2] << 4)).astype(np.uint8)


def pack_zero_points(qb: QuantizedBlocks) -> Optional[np.ndarray]:
    """(N, ceil(n_blocks * bits / 8)) uint8: MatMulNBits' zero points (4 bits: two blocks a byte, low nibble first),
    or None for the symmetric form."""
    if qb.zero_points is None:
        return None
    z = qb.zero_points
    if qb.bits == 8:
        return z
    n, nb = z.shape
    if nb % 2:
        z = np.concatenate([z, np.zeros((n, 1), np.uint8)], axis=1)
    return (z[:, 0::2] | (z[:, 1::2] << 4)).astype(np.uint8)
