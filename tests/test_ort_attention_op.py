"""The onnxruntime custom-op library's DecodeAttention / DecodeAttentionInt8 (ops/ort) against float64 numpy written
from the definition (the attention of the int8-dequantized cache, for the int8 op), at adversarial shapes: batch 1
and 8, 1 / 17 / 4,095 / 16,384 cached positions, GQA ratios 1 / 3 / 8, head_dim 64 / 128, one and several new tokens
(a causal block), per-sequence valid lengths (the buffer cache's masked tail), every instruction set this CPU runs.
Tolerance: 2x the error of the stock float32 path (the same attention as onnxruntime's own MatMul / Softmax nodes,
on the same dequantized cache) against the same oracle, plus a 1e-6 floor. Planted faults (a key scale read from
the next position; the slices' softmax maxima not carried to a common one) are compiled in and must fail."""
import os

import numpy as np
import pytest

ort = pytest.importorskip("onnxruntime")

NEG = -1e9  # the export's mask value


def _isas():
    from paddle_vha.serve.ort_ops import attention_isa

    old = os.environ.pop("VHA_ATTENTION_ISA", None)
    try:
        best = attention_isa()
    finally:
        if old is not None:
            os.environ["VHA_ATTENTION_ISA"] = old
    return {"avx512": ["baseline", "avx2", "avx512"], "avx2": ["baseline", "avx2"]}.get(best, ["baseline"])


def _model(int8: bool, scale: float, shapes, fresh: bool = False):
    import onnx
    from onnx import TensorProto, helper

    f, u8, i8 = TensorProto.FLOAT, TensorProto.UINT8, TensorProto.INT8
    names = ["q", "key", "key_scale", "value", "value_scale", "mask"] if int8 else ["q", "key", "value", "mask"]
    names += ["key_new", "value_new"] if fresh else []
    types = {"q": f, "key": u8 if int8 else f, "key_scale": f, "value": i8 if int8 else f, "value_scale": f, "mask": f,
             "key_new": f, "value_new": f}
    op = "DecodeAttention" + ("Buffer" if fresh else "") + ("Int8" if int8 else "")
    node = helper.make_node(op, names, ["y"], domain="ai.paddle_vha", scale=float(scale))
    graph = helper.make_graph([node], "attn", [helper.make_tensor_value_info(n, types[n], shapes[n]) for n in names],
                              [helper.make_tensor_value_info("y", f, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.paddle_vha", 1)])
    return model.SerializeToString()


def _stock_model(scale: float):
    """The export's float attention nodes: MatMul(q, Transpose(key)) * scale + mask -> Softmax -> MatMul(., value)."""
    from onnx import TensorProto, helper, numpy_helper

    f = TensorProto.FLOAT
    nodes = [helper.make_node("Transpose", ["key"], ["kt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["q", "kt"], ["s"]),
             helper.make_node("Mul", ["s", "scale"], ["ss"]),
             helper.make_node("Add", ["ss", "mask"], ["sm"]),
             helper.make_node("Softmax", ["sm"], ["p"], axis=-1),
             helper.make_node("MatMul", ["p", "value"], ["y"])]
    graph = helper.make_graph(nodes, "stock", [helper.make_tensor_value_info(n, f, None) for n in
                                               ("q", "key", "value", "mask")],
                              [helper.make_tensor_value_info("y", f, None)],
                              [numpy_helper.from_array(np.asarray(scale, np.float32), "scale")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def _session(blob, library=None, threads=2):
    from paddle_vha.serve.ort_ops import register

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    if library is not None:
        so.register_custom_ops_library(str(library))
    else:
        register(so)
    return ort.InferenceSession(blob, so, providers=["CPUExecutionProvider"])


def _case(B, T, G, d, S, H=1, seed=0):
    """q (B, H, G*S, d), float cache (B, H, T, d) x2 with an outlier channel, mask (B, 1, S, T): sequence b holds
    lengths[b] positions (the rest masked), its S new tokens the last S of them (causal among themselves)."""
    rng = np.random.default_rng(seed + 7 * T + B + G + d)
    q = rng.standard_normal((B, H, G * S, d)).astype(np.float32)
    k = rng.standard_normal((B, H, T, d)).astype(np.float32)
    k[..., 3] *= 8.0  # an outlier channel, as real keys have
    v = rng.standard_normal((B, H, T, d)).astype(np.float32)
    lengths = np.maximum(S, T - rng.integers(0, max(1, T // 3) + 1, B)) if B > 1 else np.array([T])
    mask = np.full((B, 1, S, T), NEG, np.float32)
    for b in range(B):
        for s in range(S):
            mask[b, 0, s, : lengths[b] - S + s + 1] = 0.0
    return q, k, v, mask


def _quantize(x, keys: bool):
    """The export's int8 cache (paddle_vha/export/kv_cache.py): per (b, h, t) scale max|x| / 127; keys uint8 + 128."""
    s = np.abs(x).max(-1, keepdims=True).astype(np.float32) / 127.0
    s = np.where(s == 0, np.float32(1e-30), s).astype(np.float32)
    c = np.clip(np.rint(x / s), -127, 127)
    return ((c + 128).astype(np.uint8) if keys else c.astype(np.int8)), s


def _oracle(q, k, v, mask, scale):
    q, k, v, mask = (np.asarray(a, np.float64) for a in (q, k, v, mask))
    R, M = q.shape[2], mask.shape[2]
    m = mask[:, :, np.arange(R) % M]  # (B, 1, R, T)
    s = scale * np.einsum("bhrd,bhtd->bhrt", q, k) + m
    s -= s.max(-1, keepdims=True)
    p = np.exp(s)
    p /= p.sum(-1, keepdims=True)
    return np.einsum("bhrt,bhtd->bhrd", p, v)


def _rel(a, b):
    return float(np.abs(a - b).max() / (np.abs(b).max() + 1e-30))


def _run(q, k, v, mask, scale, int8, library=None, isa=None):
    if int8:
        ku, ks = _quantize(k, keys=True)
        vi, vs = _quantize(v, keys=False)
        feeds = dict(q=q, key=ku, key_scale=ks, value=vi, value_scale=vs, mask=mask)
        kd = (ku.astype(np.float32) - 128) * ks  # the cache the op reads, dequantized: what the oracle attends
        vd = vi.astype(np.float32) * vs
    else:
        feeds, kd, vd = dict(q=q, key=k, value=v, mask=mask), k, v
    shapes = {n: list(a.shape) for n, a in feeds.items()}
    sess = _session(_model(int8, scale, shapes), library)
    if isa:
        os.environ["VHA_ATTENTION_ISA"] = isa
    try:
        y = sess.run(None, feeds)[0]
    finally:
        os.environ.pop("VHA_ATTENTION_ISA", None)
    want = _oracle(q, kd, vd, mask, scale)
    R, M = q.shape[2], mask.shape[2]
    stock = _session(_stock_model(scale)).run(None, dict(q=q, key=kd.astype(np.float32), value=vd.astype(np.float32),
                                                            mask=np.ascontiguousarray(mask[:, :, np.arange(R) % M])))[0]
    return y, want, stock


GRID = [(B, T, G, d) for B in (1, 8) for T in (1, 17, 4095, 16384) for G in (1, 3, 8) for d in (64, 128)
        if not (B == 8 and T == 16384 and d == 128 and G == 8)]


@pytest.mark.parametrize("int8", [False, True], ids=["fp32", "int8"])
@pytest.mark.parametrize("B,T,G,d", GRID)
def test_decode_attention_matches_float64(B, T, G, d, int8):
    q, k, v, mask = _case(B, T, G, d, S=1)
    scale = 1.0 / np.sqrt(d)
    for isa in (_isas() if T <= 4095 else _isas()[-1:]):  # 16,384 positions: the instruction set a session runs
        y, want, stock = _run(q, k, v, mask, scale, int8, isa=isa)
        err, ref = _rel(y, want), _rel(stock, want)
        print(f"{isa}: fused {err:.3e}  stock float32 path {ref:.3e}")
        assert y.shape == want.shape
        assert err <= 2 * ref + 1e-6, (isa, err, ref)


@pytest.mark.parametrize("int8", [False, True], ids=["fp32", "int8"])
@pytest.mark.parametrize("S,H,d", [(3, 3, 64), (5, 2, 96), (1, 5, 80)])
def test_several_new_tokens_odd_head_counts_and_widths(S, H, d, int8):
    """A causal block of S new tokens (R = G x S rows, the mask per token: M = S) over 4,099 positions (prime),
    KV heads 2 / 3 / 5, head_dim 96 / 80 (not a multiple of the kernels' vector blocks: their remainder paths),
    batch 3 with different valid lengths, every instruction set."""
    q, k, v, mask = _case(3, 4099, 3, d, S=S, H=H)
    for isa in _isas():
        y, want, stock = _run(q, k, v, mask, d ** -0.5, int8, isa=isa)
        err, ref = _rel(y, want), _rel(stock, want)
        print(f"{isa}: fused {err:.3e}  stock {ref:.3e}")
        assert err <= 2 * ref + 1e-6, (isa, err, ref)


def test_every_position_masked_gives_the_stock_graphs_answer():
    """A row with no unmasked position (a padded sequence): the stock softmax averages every position uniformly;
    the op must not divide by zero or skip them all."""
    q, k, v, mask = _case(2, 700, 3, 64, S=1)
    mask[1] = NEG
    y, want, stock = _run(q, k, v, mask, 0.125, False)
    print(_rel(y, want), _rel(stock, want))
    assert np.isfinite(y).all() and _rel(y, want) <= 2 * _rel(stock, want) + 1e-6


def test_bad_shapes_are_refused_in_one_line():
    q, k, v, mask = _case(1, 33, 3, 64, S=1)
    feeds = dict(q=q, key=k, value=v[:, :, :32], mask=mask)
    sess = _session(_model(False, 0.125, {n: list(a.shape) for n, a in feeds.items()}))
    with pytest.raises(Exception, match="value must have key's shape"):
        sess.run(None, feeds)


@pytest.mark.slow
@pytest.mark.parametrize("fault,int8", [("VHA_PLANT_FAULT_SCALE_POSITION", True),
                                         ("VHA_PLANT_FAULT_BLOCK_MAX", False)])
def test_planted_faults_fail(fault, int8, tmp_path):
    """The library rebuilt with a planted fault gives an error far above the tolerance on a case of the grid."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "ort_build", os.path.join(os.path.dirname(__file__), "..", "ops", "ort", "build.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    lib = mod.build(defines=[fault], out_dir=tmp_path / "lib")
    q, k, v, mask = _case(1, 4095, 3, 64, S=1)
    q *= 3.0  # peaked rows: the slices' maxima differ by more than rounding
    y, want, stock = _run(q, k, v, mask, 0.125, int8, library=lib)
    err, ref = _rel(y, want), _rel(stock, want)
    print(f"{fault}: {err:.3e} (tolerance {2 * ref + 1e-6:.3e})")
    assert err > 10 * (2 * ref + 1e-6)


def test_an_instruction_set_it_cannot_name_is_refused(monkeypatch):
    q, k, v, mask = _case(1, 40, 3, 64, S=1)
    feeds = dict(q=q, key=k, value=v, mask=mask)
    sess = _session(_model(False, 0.125, {n: list(a.shape) for n, a in feeds.items()}))
    monkeypatch.setenv("VHA_ATTENTION_ISA", "sse9")
    with pytest.raises(Exception, match="VHA_ATTENTION_ISA=sse9 is not one of auto, baseline, avx2, avx512"):
        sess.run(None, feeds)


def test_header_download_is_checked_against_its_pinned_digest(tmp_path, monkeypatch):
    """ops/ort/build.py takes onnxruntime's headers only from a package whose SHA-256 is the pinned one: another file
    is refused (naming both digests) and nothing is left in the cache."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "ort_build_check", os.path.join(os.path.dirname(__file__), "..", "ops", "ort", "build.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    fake = tmp_path / "fake.deb"
    fake.write_bytes(b"!<arch>\nnot the package")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("VHA_ORT_HEADERS", raising=False)
    monkeypatch.setattr(mod, "HEADERS_URL", fake.as_uri())
    with pytest.raises(RuntimeError, match=f"SHA-256 [0-9a-f]{{64}}, expected {mod.HEADERS_SHA256}"):
        mod.headers()
    left = list((tmp_path / "cache" / "paddle_vha" / "ort-headers").iterdir())
    assert left == [], left



@pytest.mark.parametrize("int8", [False, True], ids=["fp32", "int8"])
@pytest.mark.parametrize("B,T,S,G", [(1, 17, 1, 3), (3, 4095, 1, 8), (2, 1031, 3, 3), (2, 0, 5, 3), (1, 1, 1, 1)])
def test_buffer_variant_attends_the_cache_then_the_new_entries(B, T, S, G, int8):
    """DecodeAttentionBuffer[Int8]: the buffer flavour's attention, the cache's T positions (int8 or float32) and the
    step's S new entries (float32, after them), one mask over T + S columns (the buffer's empty tail masked, the new
    tokens causal among themselves); T = 0 is the first step into an empty buffer."""
    d, H = 64, 2
    q, k, v, mask = _case(B, T + S, G, d, S=S, H=H, seed=11)
    kb, vb, kn, vn = k[:, :, :T], v[:, :, :T], k[:, :, T:], v[:, :, T:]
    mask[:, :, :, max(0, T - 3):T] = NEG  # the buffer's last slots empty in every row
    if int8:
        ku, ks = _quantize(kb, keys=True)
        vi, vs = _quantize(vb, keys=False)
        feeds = dict(q=q, key=ku, key_scale=ks, value=vi, value_scale=vs, mask=mask, key_new=kn, value_new=vn)
        kd = np.concatenate([(ku.astype(np.float32) - 128) * ks, kn], 2)
        vd = np.concatenate([vi.astype(np.float32) * vs, vn], 2)
    else:
        feeds, kd, vd = dict(q=q, key=kb, value=vb, mask=mask, key_new=kn, value_new=vn), k, v
    sess = _session(_model(int8, d ** -0.5, {n: list(a.shape) for n, a in feeds.items()}, fresh=True))
    y = sess.run(None, feeds)[0]
    want = _oracle(q, kd, vd, mask, d ** -0.5)
    R = q.shape[2]
    stock = _session(_stock_model(d ** -0.5)).run(None, dict(
        q=q, key=kd.astype(np.float32), value=vd.astype(np.float32),
        mask=np.ascontiguousarray(mask[:, :, np.arange(R) % S])))[0]
    err, ref = _rel(y, want), _rel(stock, want)
    print(f"fused {err:.3e}  stock {ref:.3e}")
    assert err <= 2 * ref + 1e-6


def test_buffer_variant_refuses_a_mask_without_the_new_columns():
    q, k, v, mask = _case(1, 20, 3, 64, S=1)
    feeds = dict(q=q, key=k[:, :, :19], value=v[:, :, :19], mask=mask[..., :19], key_new=k[:, :, 19:],
                 value_new=v[:, :, 19:])
    sess = _session(_model(False, 0.125, {n: list(a.shape) for n, a in feeds.items()}, fresh=True))
    with pytest.raises(Exception, match="mask must be \\(B or 1, 1, M, T \\+ S\\)"):
        sess.run(None, feeds)
