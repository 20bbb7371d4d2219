"""The block quantizer (paddle_vha/export/blockquant.py) against a float64 dequantization oracle written from
onnxruntime's MatMulNBits / GatherBlockQuantized layout (nothing imported from the package for it), and onnxruntime's
own kernels reading what it writes. Planted faults (a zero point off by one, a scale from the wrong block, codes of
the wrong nibble order) each fail the oracle check.

The oracle, from the contrib-op spec: B (N, n_blocks, block * bits / 8) uint8, two 4-bit codes a byte with the first
in the low nibble; scales (N, n_blocks) float; zero points (N, ceil(n_blocks * bits / 8)) uint8, two 4-bit blocks a
byte with the first block in the low nibble (absent: 2^(bits - 1)); W[j*block + i, n] = s[n, j] * (q[n, j, i] - z[n, j])
for j*block + i < K.
"""
import numpy as np
import pytest

from paddle_vha.export import blockquant as bq

SHAPES = [(1, 1), (17, 3), (64, 5), (200, 24), (576, 7)]  # K not a multiple of the block, N = 1, a prime K


def oracle_weight(packed, scales, zero_points, bits, block, k):
    """(K, N) float64 from the stored bytes, as MatMulNBits reads them."""
    packed = np.asarray(packed, np.uint8)
    n, nb = scales.shape
    if bits == 4:
        codes = np.empty((n, nb, block), np.int64)
        codes[..., 0::2] = packed & 0x0F
        codes[..., 1::2] = packed >> 4
    else:
        codes = packed.astype(np.int64)
    if zero_points is None:
        z = np.full((n, nb), 2 ** (bits - 1), np.float64)
    elif bits == 4:
        zp = np.asarray(zero_points, np.uint8).reshape(n, -1)
        both = np.stack([zp & 0x0F, zp >> 4], axis=-1).reshape(n, -1)
        z = both[:, :nb].astype(np.float64)
    else:
        z = np.asarray(zero_points, np.float64).reshape(n, nb)
    w = (codes - z[..., None]) * np.asarray(scales, np.float64)[..., None]  # (N, nb, block)
    return w.reshape(n, nb * block)[:, :k].T


def stored(w, bits, block, recipe, importance=None):
    qb = bq.quantize_blocks(w, bits, block, bq.RECIPES[recipe], importance)
    return bq.pack_codes(qb), qb.scales, bq.pack_zero_points(qb), qb


def check_blocks(w, packed, scales, zps, bits, block, recipe, importance=None):
    """What every recipe must give, from the oracle: the weight's values back within each block's step where the
    grid covers them (round to nearest: half a step; the search: no worse than round to nearest, block by block, in
    its own weighted error). Returns the oracle's weight."""
    k, n = w.shape
    got = oracle_weight(packed, scales, zps, bits, block, k)
    x = w.astype(np.float64)
    err = np.abs(got - x)
    print(f"{recipe} bits {bits} block {block} K {k} N {n}: max |w - deq| {err.max():.3e}, mean {err.mean():.3e}")
    nb = -(-k // block)
    step = np.repeat(np.abs(np.asarray(scales, np.float64)), block, axis=1)[:, :k].T  # (K, N) each entry's step
    if recipe == "asym":  # round to nearest on a grid spanning [min, max] (and 0)
        assert (err <= 0.5 * step * (1 + 1e-5) + 1e-12).all(), f"{recipe}: an entry more than half a step away"
    elif recipe == "rtn":  # the extreme on -2^(b-1): entries of the other sign reach at most 2^(b-1) - 1 steps
        inside = np.abs(x) <= (2 ** (bits - 1) - 0.5) * step
        assert (err[inside] <= 0.5 * step[inside] * (1 + 1e-5) + 1e-12).all(), "rtn: an entry inside the grid rounded wrong"
        assert (err <= step * (1 + 1e-5) + 1e-12).all(), "rtn: an entry more than a step away"
    else:
        base = "asym" if bq.RECIPES[recipe].asymmetric else "rtn"
        ref = oracle_weight(*stored(w, bits, block, base, importance)[:3], bits, block, k)
        wt = np.ones(k) if importance is None or not bq.RECIPES[recipe].weighted else importance
        pad = nb * block - k

        def block_err(a):
            e = np.concatenate([wt[:, None] * (a - x) ** 2, np.zeros((pad, n))])
            return e.reshape(nb, block, n).sum(1)
        assert (block_err(got) <= block_err(ref) * (1 + 1e-4) + 1e-12).all(), \
            f"{recipe}: a block fitted worse than round to nearest"
    return got


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("block", [16, 32, 128])
@pytest.mark.parametrize("recipe", ["rtn", "symsearch", "asym", "search", "awq"])
def test_every_recipe_against_the_oracle(bits, block, recipe):
    rng = np.random.default_rng(bits * 1000 + block)
    for k, n in SHAPES:
        w = (rng.standard_normal((k, n)) * rng.uniform(0.2, 3.0, (k, 1))).astype(np.float32)
        w[:, 0] += 0.7  # a column far from symmetric: what zero points are for
        imp = rng.uniform(0.05, 10.0, k)
        packed, scales, zps, qb = stored(w, bits, block, recipe, imp)
        assert packed.dtype == np.uint8 and packed.shape == (n, -(-k // block), block * bits // 8)
        assert scales.dtype == np.float32 and scales.shape == (n, -(-k // block))
        assert (zps is None) == (not bq.RECIPES[recipe].asymmetric)
        got = check_blocks(w, packed, scales, zps, bits, block, recipe, imp)
        np.testing.assert_allclose(qb.dequantize(), got, rtol=0, atol=1e-12)  # the package's own view agrees


def test_search_and_weights_pay():
    """The search lowers the squared error of round to nearest, and weighing by the activations lowers the error
    that they weigh (the output's), on weights shaped like a trained layer's (heavy-tailed)."""
    rng = np.random.default_rng(1)
    k, n = 256, 64
    w = (rng.standard_t(4, (k, n)) * 0.05).astype(np.float32)
    imp = rng.lognormal(0, 1.5, k)
    err = {}
    for recipe in ("asym", "search", "awq"):
        got = oracle_weight(*stored(w, 4, 32, recipe, imp)[:3], 4, 32, k)
        d = got - w
        err[recipe] = ((d ** 2).sum(), (imp[:, None] * d ** 2).sum())
    print({r: (f"{e[0]:.4g}", f"{e[1]:.4g}") for r, e in err.items()})
    assert err["search"][0] < 0.97 * err["asym"][0]
    assert err["awq"][1] < 0.97 * err["search"][1]


def test_zero_weights_and_constant_blocks():
    w = np.zeros((64, 3), np.float32)
    w[:, 1] = 0.25  # a constant block: the grid must still hold it
    for recipe in ("rtn", "asym", "search", "awq"):
        for bits in (4, 8):
            packed, scales, zps, _ = stored(w, bits, 32, recipe)
            got = oracle_weight(packed, scales, zps, bits, 32, 64)
            assert np.isfinite(got).all()
            np.testing.assert_allclose(got[:, 0], 0.0, atol=0)
            np.testing.assert_allclose(got[:, 1], 0.25, rtol=1e-6)


def _ort_matmul(packed, scales, zps, bits, block, k, n, a):
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    inits = [numpy_helper.from_array(packed, "B"), numpy_helper.from_array(scales, "S")]
    ins = ["A", "B", "S"]
    if zps is not None:
        inits.append(numpy_helper.from_array(zps, "Z"))
        ins.append("Z")
    node = helper.make_node("MatMulNBits", ins, ["Y"], domain="com.microsoft", K=k, N=n, bits=bits, block_size=block,
                            accuracy_level=0)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("A", TensorProto.FLOAT, list(a.shape))],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [a.shape[0], n])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    return ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"A": a})[0]


@pytest.mark.parametrize("bits,block,recipe", [(4, 32, "awq"), (4, 128, "asym"), (8, 16, "search"), (8, 64, "rtn")])
def test_onnxruntime_reads_what_is_written(bits, block, recipe):
    """MatMulNBits (accuracy_level 0: float compute) over the stored bytes equals the oracle weight's product."""
    rng = np.random.default_rng(7)
    k, n = 200, 24
    w = rng.standard_normal((k, n)).astype(np.float32)
    packed, scales, zps, _ = stored(w, bits, block, recipe, rng.uniform(0.1, 2, k))
    a = rng.standard_normal((3, k)).astype(np.float32)
    ref = a.astype(np.float64) @ oracle_weight(packed, scales, zps, bits, block, k)
    got = _ort_matmul(packed, scales, zps, bits, block, k, n, a)
    rel = np.abs(got - ref).max() / np.abs(ref).max()
    print(f"onnxruntime vs oracle: max rel {rel:.2e}")
    assert rel < 1e-5


@pytest.mark.parametrize("fault", ["zero point off by one", "scale from the wrong block", "nibbles swapped"])
def test_planted_faults_fail_the_oracle(fault):
    """Each fault planted in what the quantizer stores makes check_blocks (or onnxruntime vs the weights) fail."""
    real_zp, real_codes = bq.pack_zero_points, bq.pack_codes
    rng = np.random.default_rng(3)
    k, n, block = 128, 8, 32
    w = (rng.standard_normal((k, n)) + 0.5).astype(np.float32)
    qb = bq.quantize_blocks(w, 4, block, bq.RECIPES["asym"])
    packed, scales, zps = real_codes(qb), qb.scales.copy(), real_zp(qb)
    if fault == "zero point off by one":
        z = qb.zero_points.astype(np.int64)
        z[0, 1] = (z[0, 1] + 1) % 16
        zps = real_zp(bq.QuantizedBlocks(qb.codes, qb.scales, z.astype(np.uint8), 4, block, k))
    elif fault == "scale from the wrong block":
        scales = np.roll(scales, 1, axis=1)
    else:
        packed = ((packed << 4) | (packed >> 4)).astype(np.uint8)
    check_blocks(w, real_codes(qb), qb.scales, real_zp(qb), 4, block, "asym")  # the real one passes
    with pytest.raises(AssertionError):
        check_blocks(w, packed, scales, zps, 4, block, "asym")
