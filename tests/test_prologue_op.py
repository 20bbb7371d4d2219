"""Fused VHA prologue operator (ops/, paddle_vha/kernels/) against the float64 numpy oracle and the
layer's composed path: forward and backward, fp32 / bf16 / fp64, finite differences, static graph and
jit.save, layer integration and fallback, an nvcc compile of the CUDA sources, and the GPU check's no-GPU self-test."""
import logging
import os
import shutil
import subprocess
import sys

import numpy as np
import paddle
import pytest
from paddleformers.transformers.qwen3.modeling import Qwen3RotaryEmbedding, rotate_half

import oracle
from prologue_check import oracle as po
from _utils import rel_err, tiny_config, to_numpy
from paddle_vha import Qwen3VHAAttention, VHAConfigError
from paddle_vha.kernels import cpu_variant as cv
from paddle_vha.kernels import dispatch
from paddle_vha.kernels import op_loader
from paddle_vha.kernels.prologue import fused_prologue
from paddle_vha.vha.attention import premix as premix_ref

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FP32_ULP = 2.0**-23
BF16_ULP = 2.0**-8


@pytest.fixture(scope="module")
def op():
    if shutil.which(os.environ.get("CXX", "c++")) is None and shutil.which("g++") is None:
        pytest.skip("no C++ compiler on PATH: the fused prologue cannot be built here")
    mod = op_loader.load_op()
    assert mod is not None, f"fused prologue did not build/load: {op_loader.load_error()}"
    return mod


# (B, S, H_v, H_kv, d, r, position offset): decode S=1 with an offset, prime S, B > 1, r < d,
# H_kv = 1 / 2 / 3, d = 8 / 64 / 128 (the 1.7B head shape: H_p 8, H_kv 2, d 128).
SHAPES = [
    (1, 1, 16, 2, 128, 128, 37),
    (2, 13, 4, 1, 64, 64, 0),
    (3, 7, 8, 2, 64, 40, 5),
    (2, 31, 16, 2, 128, 128, 0),
    (1, 5, 9, 3, 8, 5, 2),
]
IDS = [f"B{b}-S{s}-Hv{hv}-Hkv{hkv}-d{d}-r{r}-off{o}" for b, s, hv, hkv, d, r, o in SHAPES]


def make_case(shape, seed=0):
    """A composed-path layer (fused off) with non-trivial weights, inputs, and Qwen3's RoPE tables."""
    B, S, h_v, h_kv, d, r, off = shape
    paddle.seed(seed)
    np.random.seed(seed)
    cfg = tiny_config(num_attention_heads=h_v, num_key_value_heads=h_kv, head_dim=d, vha_q_head_dim=r,
                      vha_fused_prologue=False)
    attn = Qwen3VHAAttention(cfg, 0)
    attn.q_norm.weight.set_value(1.0 + 0.3 * paddle.randn([d]))
    attn.k_norm.weight.set_value(1.0 + 0.3 * paddle.randn([d]))
    attn.vha_premix_weight.set_value(attn.vha_premix_weight + 0.2 * paddle.randn(attn.vha_premix_weight.shape))
    q_phys = paddle.randn([B, S, h_v // h_kv, r])
    k = 2.0 * paddle.randn([B, S, h_kv, d]) + 0.5
    pos = paddle.arange(off, off + S, dtype="int64").expand([B, S])
    cos, sin = Qwen3RotaryEmbedding(cfg)(q_phys, pos)  # (B, S, d) fp32
    return cfg, attn, q_phys, k, cos, sin


def weights(attn):
    return [attn.vha_premix_weight, attn.q_norm.weight, attn.k_norm.weight]


def run(attn, q_phys, k, cos, sin, fused: bool, dtype=None):
    """The layer's prologue (composed or fused), in (B, H, S, d)."""
    attn.config.vha_fused_prologue = fused
    return attn.prologue(q_phys, k, cos, sin)


def bhsd(x):  # (B, S, H, d) oracle layout -> (B, H, S, d)
    return np.transpose(x, (0, 2, 1, 3))


def oracle_inputs(attn, q_phys, k, cos, sin):
    return [to_numpy(t) for t in (q_phys, k, *weights(attn), cos, sin)]


@pytest.mark.parametrize("shape", SHAPES, ids=IDS)
def test_forward_fp32_vs_oracle_and_composed(op, shape):
    cfg, attn, q_phys, k, cos, sin = make_case(shape)
    eps = cfg.rms_norm_eps
    ref_q, ref_k = po.forward(*oracle_inputs(attn, q_phys, k, cos, sin), eps)
    ref_q, ref_k = bhsd(ref_q), bhsd(ref_k)
    comp = [to_numpy(t) for t in run(attn, q_phys, k, cos, sin, fused=False)]
    fused = [to_numpy(t) for t in run(attn, q_phys, k, cos, sin, fused=True)]
    for name, f, c, ref in (("q", fused[0], comp[0], ref_q), ("k", fused[1], comp[1], ref_k)):
        e_c = rel_err(c, ref, f"{name} composed fp32 vs float64")
        e_f = rel_err(f, ref, f"{name} fused    fp32 vs float64")
        assert e_f <= 2 * e_c + FP32_ULP, name

    # RoPE convention pinned against the oracle built from positions + theta (not from the tables):
    B, S, *_, off = shape
    positions = np.broadcast_to(np.arange(off, off + S), (B, S))
    u = po.premix(to_numpy(q_phys), to_numpy(attn.vha_premix_weight))
    exact_q = oracle.rope(oracle.rms_norm(u, to_numpy(attn.q_norm.weight), eps), positions, cfg.rope_theta)
    # fp32 tables carry angle error ~ position * 2^-24, so this is a convention check, not a precision one
    assert rel_err(fused[0], bhsd(exact_q), "q fused vs oracle.rope(positions)") <= 1e-4


@pytest.mark.parametrize("shape", SHAPES, ids=IDS)
def test_backward_fp32_vs_oracle_and_composed(op, shape):
    cfg, attn, q_phys, k, cos, sin = make_case(shape)
    q_phys.stop_gradient = k.stop_gradient = False
    inputs = [q_phys, k, *weights(attn)]
    g_q = np.random.randn(*bhsd(np.empty((shape[0], shape[1], shape[2], shape[4]))).shape)
    g_k = np.random.randn(shape[0], shape[3], shape[1], shape[4])
    gq_t, gk_t = paddle.to_tensor(g_q, dtype="float32"), paddle.to_tensor(g_k, dtype="float32")

    def grads(fused):
        q, kk = run(attn, q_phys, k, cos, sin, fused=fused)
        return [to_numpy(g) for g in paddle.grad([q, kk], inputs, [gq_t, gk_t])]

    ref = po.vjp(*oracle_inputs(attn, q_phys, k, cos, sin), cfg.rms_norm_eps,
                 bhsd(to_numpy(gq_t)), bhsd(to_numpy(gk_t)))
    comp, fused = grads(False), grads(True)
    for name, f, c, r in zip(["q_phys", "k", "premix", "q_norm.w", "k_norm.w"], fused, comp, ref):
        e_c = rel_err(c, r, f"d{name} composed fp32 vs float64")
        e_f = rel_err(f, r, f"d{name} fused    fp32 vs float64")
        assert e_f <= 2 * e_c + FP32_ULP, name


def _bf16(x):
    """Materialise as bf16 in both directions (the cast pair rounds forward values and gradients)."""
    return x.astype("bfloat16").astype("float32")


def composed_bf16(q_phys, k, w_premix, wq, wk, cos, sin, eps):
    """The layer's composed chain as a bf16 framework runs it: every intermediate tensor is bf16, GEMM and
    elementwise arithmetic in fp32. Paddle's CPU build has no bf16 matmul/add kernels, so each op runs in
    fp32 on bf16 values and its output is rounded to bf16 (inputs must already hold bf16 values)."""
    q = _bf16(premix_ref(q_phys, w_premix))  # bf16 GEMM, fp32 accumulation, bf16 output

    def norm(x, w):  # PaddleFormers RMSNorm in bf16: fp32 statistics, bf16 normalised value, times bf16 weight
        var = x.pow(2).mean(-1, keepdim=True)
        return _bf16(_bf16(paddle.rsqrt(var + eps) * x) * w)

    q, kk = norm(q, wq).transpose([0, 2, 1, 3]), norm(k, wk).transpose([0, 2, 1, 3])
    c, s = cos.unsqueeze(1), sin.unsqueeze(1)

    def rope(x):
        return _bf16(_bf16(x * c) + _bf16(rotate_half(x) * s))

    return rope(q), rope(kk)


@pytest.mark.parametrize("shape", [SHAPES[0], SHAPES[2], SHAPES[3]], ids=[IDS[0], IDS[2], IDS[3]])
def test_bf16_forward_backward_vs_oracle_and_composed(op, shape):
    cfg, attn, q_phys, k, cos, sin = make_case(shape)
    eps = cfg.rms_norm_eps
    vals = [_bf16(t) for t in (q_phys, k, *weights(attn), cos, sin)]  # bf16-representable fp32 values
    g_q = _bf16(paddle.randn([shape[0], shape[2], shape[1], shape[4]]))
    g_k = _bf16(paddle.randn([shape[0], shape[3], shape[1], shape[4]]))
    np_vals = [to_numpy(t) for t in vals]
    ref_fwd = [bhsd(x) for x in po.forward(*np_vals, eps)]
    ref_bwd = po.vjp(*np_vals, eps, bhsd(to_numpy(g_q)), bhsd(to_numpy(g_k)))

    comp_in = [t.detach() for t in vals]
    for t in comp_in[:5]:
        t.stop_gradient = False
    comp_out = composed_bf16(*comp_in, eps)
    comp_g = paddle.grad(list(comp_out), comp_in[:5], [g_q, g_k])

    bf_in = [t.astype("bfloat16") for t in vals]
    for t in bf_in[:5]:
        t.stop_gradient = False
    fused_out = fused_prologue(*bf_in, eps, heads_first=True)
    assert fused_out[0].dtype == paddle.bfloat16
    fused_g = paddle.grad(list(fused_out), bf_in[:5], [g_q.astype("bfloat16"), g_k.astype("bfloat16")])

    names = ["q", "k", "dq_phys", "dk", "dpremix", "dq_norm.w", "dk_norm.w"]
    for name, f, c, r in zip(names, [*fused_out, *fused_g], [*comp_out, *comp_g], [*ref_fwd, *ref_bwd]):
        e_c = rel_err(to_numpy(c), r, f"{name} composed bf16 vs float64")
        e_f = rel_err(to_numpy(f), r, f"{name} fused    bf16 vs float64")
        assert e_f <= 2 * e_c + BF16_ULP / 2, name


def test_fp16_forward_backward_match_oracle(op):
    cfg, attn, q_phys, k, cos, sin = make_case(SHAPES[2])
    vals = [t.detach().astype("float16") for t in (q_phys, k, *weights(attn), cos, sin)]
    for t in vals[:5]:
        t.stop_gradient = False
    q, kk = fused_prologue(*vals, cfg.rms_norm_eps)
    np_vals = [to_numpy(t) for t in vals]
    ref_q, ref_k = po.forward(*np_vals, cfg.rms_norm_eps)
    assert q.dtype == paddle.float16
    # fp32 arithmetic and one fp16 rounding of each output (2^-11 relative)
    assert rel_err(to_numpy(q), bhsd(ref_q), "q fused fp16") <= 2.0**-10
    assert rel_err(to_numpy(kk), bhsd(ref_k), "k fused fp16") <= 2.0**-10
    g_q = paddle.randn(q.shape).astype("float16")
    g_k = paddle.randn(kk.shape).astype("float16")
    grads = paddle.grad([q, kk], vals[:5], [g_q, g_k])
    ref = po.vjp(*np_vals, cfg.rms_norm_eps, bhsd(to_numpy(g_q)), bhsd(to_numpy(g_k)))
    for name, g, r in zip(["dq_phys", "dk", "dpremix", "dq_norm.w", "dk_norm.w"], grads, ref):
        assert g.dtype == paddle.float16
        assert rel_err(to_numpy(g), r, f"{name} fused fp16") <= 2.0**-10, name


@pytest.mark.parametrize("shape", [SHAPES[0], SHAPES[2], SHAPES[4]], ids=[IDS[0], IDS[2], IDS[4]])
def test_float64_oracle_and_finite_differences(op, shape):
    """float64 op vs the oracle (tight), and its autograd vs central differences of the oracle's forward."""
    cfg, attn, q_phys, k, cos, sin = make_case(shape)
    eps = cfg.rms_norm_eps
    vals = [paddle.to_tensor(to_numpy(t)) for t in (q_phys, k, *weights(attn), cos, sin)]
    for t in vals[:5]:
        t.stop_gradient = False
    q, kk = fused_prologue(*vals, eps, heads_first=False)  # [B, S, H, d] layout this time
    np_vals = [to_numpy(t) for t in vals]
    ref_q, ref_k = po.forward(*np_vals, eps)
    assert rel_err(to_numpy(q), ref_q, "q fused float64") <= 1e-13
    assert rel_err(to_numpy(kk), ref_k, "k fused float64") <= 1e-13

    g_q, g_k = np.random.randn(*ref_q.shape), np.random.randn(*ref_k.shape)
    grads = [to_numpy(g) for g in paddle.grad([q, kk], vals[:5], [paddle.to_tensor(g_q), paddle.to_tensor(g_k)])]
    ref = po.vjp(*np_vals, eps, g_q, g_k)

    def loss(args):
        fq, fk = po.forward(*args, eps)
        return float((fq * g_q).sum() + (fk * g_k).sum())

    h = 1e-6
    for idx, name in enumerate(["q_phys", "k", "premix", "q_norm.w", "k_norm.w"]):
        assert rel_err(grads[idx], ref[idx], f"d{name} fused float64 vs analytic oracle") <= 1e-12
        u = np.random.randn(*np_vals[idx].shape)
        plus = list(np_vals)
        minus = list(np_vals)
        plus[idx] = np_vals[idx] + h * u
        minus[idx] = np_vals[idx] - h * u
        fd = (loss(plus) - loss(minus)) / (2 * h)
        an = float((grads[idx] * u).sum())
        err = abs(fd - an) / max(abs(fd), np.linalg.norm(grads[idx]), 1e-12)
        print(f"d/d{name}: autograd {an:+.10e}  finite-diff {fd:+.10e}  rel err {err:.2e}")
        assert err <= 1e-7, name


def test_batch_one_tables_broadcast_and_missing_k_gradient(op):
    """cos/sin of shape (1, S, d) serve every batch row; a k output that misses the loss gives a zero gradient."""
    cfg, attn, q_phys, k, cos, sin = make_case(SHAPES[1])
    vals = [q_phys, k, *[w.detach() for w in weights(attn)]]
    for t in vals:
        t.stop_gradient = False
    q_full, _ = fused_prologue(*vals, cos, sin, cfg.rms_norm_eps)
    q_one, _ = fused_prologue(*vals, cos[:1], sin[:1], cfg.rms_norm_eps)
    np.testing.assert_array_equal(to_numpy(q_one), to_numpy(q_full))  # positions are the same for every row
    q_one.sum().backward()
    assert k.grad is None or float(k.grad.abs().max()) == 0.0
    assert vals[4].grad is None or float(vals[4].grad.abs().max()) == 0.0
    assert float(q_phys.grad.abs().max()) > 0


def test_threads_split_tokens_and_reduce_weight_gradients(op, monkeypatch):
    """1 vs 3 worker threads (VHA_PROLOGUE_THREADS, read per call): same outputs, and the per-thread weight
    gradient sums reduce to the oracle's."""
    shape = (2, 97, 8, 2, 64, 48, 3)  # 194 tokens: 3 threads get 64-65 tokens each
    cfg, attn, q_phys, k, cos, sin = make_case(shape)
    vals = [q_phys, k, *[w.detach() for w in weights(attn)]]
    for t in vals:
        t.stop_gradient = False
    g_q = paddle.randn([shape[0], shape[2], shape[1], shape[4]])
    g_k = paddle.randn([shape[0], shape[3], shape[1], shape[4]])
    res = {}
    for n in ("1", "3"):
        monkeypatch.setenv("VHA_PROLOGUE_THREADS", n)
        out = fused_prologue(*vals, cos, sin, cfg.rms_norm_eps)
        res[n] = [to_numpy(t) for t in (*out, *paddle.grad(list(out), vals, [g_q, g_k]))]
    np_vals = [to_numpy(t) for t in (*vals, cos, sin)]
    ref = [bhsd(x) for x in po.forward(*np_vals, cfg.rms_norm_eps)]
    ref += list(po.vjp(*np_vals, cfg.rms_norm_eps, bhsd(to_numpy(g_q)), bhsd(to_numpy(g_k))))
    for i, name in enumerate(["q", "k", "dq_phys", "dk", "dpremix", "dq_norm.w", "dk_norm.w"]):
        if i < 4:  # per-row results do not depend on the split
            np.testing.assert_array_equal(res["3"][i], res["1"][i], err_msg=name)
        assert rel_err(res["3"][i], ref[i], f"{name} 3 threads vs float64") <= 1e-6, name


# Every CPU kernel variant (ops/csrc/cpu/cpu_kernels.inc compiled for the x86-64 baseline, AVX2 and AVX-512),
# forced in turn with VHA_PROLOGUE_ISA (read by the op on every call), through the same oracle checks as above.
# Extra shapes: d = 256 with r = 24 (r % 16 != 0, a column tail in every tile width) and 194 tokens on 3 threads.
VARIANT_SHAPES = [SHAPES[0], SHAPES[2], SHAPES[3], SHAPES[4], (2, 11, 6, 3, 256, 24, 1), (2, 97, 8, 2, 64, 48, 3)]


@pytest.mark.parametrize("shape", VARIANT_SHAPES, ids=[f"B{b}-S{s}-Hv{hv}-Hkv{hkv}-d{d}-r{r}-off{o}"
                                                      for b, s, hv, hkv, d, r, o in VARIANT_SHAPES])
@pytest.mark.parametrize("variant", ["avx512", "avx2", "baseline"])
def test_every_cpu_variant_matches_oracle(op, variant, shape, monkeypatch):
    if variant not in cv.cpu_variants():
        pytest.skip(f"this CPU cannot run the {variant} kernels (it runs {cv.cpu_variants()})")
    monkeypatch.setenv("VHA_PROLOGUE_ISA", variant)
    monkeypatch.setenv("VHA_PROLOGUE_THREADS", "3")
    assert cv.cpu_variant() == variant
    test_forward_fp32_vs_oracle_and_composed(op, shape)
    test_backward_fp32_vs_oracle_and_composed(op, shape)
    test_bf16_forward_backward_vs_oracle_and_composed(op, shape)
    test_float64_oracle_and_finite_differences(op, shape)


def test_cpu_variant_choice_and_refusals(op, monkeypatch):
    """auto picks the best variant the CPU has; a named variant the CPU lacks, or an unknown name, is refused by
    the op in one line (and makes the layer's default fall back with that reason), never run or replaced."""
    have = cv.cpu_variants()
    assert have and have[-1] == "baseline" and set(have) <= {"avx512", "avx2", "baseline"}
    flags = set(cv.cpu_isa_flags().split())
    assert ("avx512" in have) == ({"avx512f", "avx512bw", "avx512dq", "avx512vl"} <= flags)
    assert ("avx2" in have) == ({"avx2", "fma"} <= flags)
    monkeypatch.delenv("VHA_PROLOGUE_ISA", raising=False)
    assert cv.cpu_variant() == have[0]
    monkeypatch.setenv("VHA_PROLOGUE_ISA", "auto")
    assert cv.cpu_variant() == have[0]
    cfg, attn, q_phys, k, cos, sin = make_case(SHAPES[2])
    w = [t.detach() for t in weights(attn)]
    missing = [v for v in ("avx512", "avx2") if v not in have]
    for bad, why in [("sse9", "is not one of auto, baseline, avx2, avx512")] + [(m, "no such kernel") for m in missing]:
        monkeypatch.setenv("VHA_PROLOGUE_ISA", bad)
        with pytest.raises(op_loader.FusedPrologueUnavailable, match=why):
            cv.cpu_variant()
        with pytest.raises(Exception, match=why):
            fused_prologue(q_phys, k, *w, cos, sin, 1e-6)
        assert why in dispatch.fused_unavailable_reason(q_phys)
        assert not dispatch.should_use_fused(None, q_phys)


def test_built_library_has_no_instruction_beyond_baseline_outside_dispatched_kernels(op):
    """objdump over the built op: AVX/AVX2 (VEX: ymm, v-prefixed mnemonics) only inside vha_cpu_avx2:: and
    vha_cpu_avx512::, AVX-512 (zmm, opmask registers) only inside vha_cpu_avx512::, so the library loads and runs
    on any x86-64 CPU; and the dispatched copies really use their instruction sets."""
    import platform
    import re

    if platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip("x86-64 only")
    objdump = shutil.which("objdump")
    if objdump is None:
        pytest.skip("no objdump (binutils) on PATH")
    so = op_loader.op_library()._name
    text = subprocess.run([objdump, "-d", "-C", "--no-show-raw-insn", so], capture_output=True, text=True,
                          check=True).stdout
    counts = {"avx2": {"ymm": 0, "zmm": 0, "vex": 0}, "avx512": {"ymm": 0, "zmm": 0, "vex": 0},
              "other": {"ymm": 0, "zmm": 0, "vex": 0}}
    offenders = {}
    func = None
    for line in text.splitlines():
        m = re.match(r"^[0-9a-f]+ <(.*)>:$", line)
        if m:
            func = m.group(1)
            continue
        if func is None or "\t" not in line:
            continue
        ins = line.split("\t")[-1].strip()
        where = "avx512" if "vha_cpu_avx512::" in func else "avx2" if "vha_cpu_avx2::" in func else "other"
        c = counts[where]
        zmm = "zmm" in ins or re.search(r"%k[1-7]\b", ins) is not None
        vex = ins[:1] == "v"
        c["zmm"] += zmm
        c["ymm"] += "ymm" in ins
        c["vex"] += vex
        if where == "other" and vex or where == "avx2" and zmm:
            offenders.setdefault(func, ins)
    print(counts)
    assert not offenders, f"instructions beyond the baseline outside the dispatched kernels: {list(offenders.items())[:5]}"
    assert counts["avx512"]["zmm"] > 0 and counts["avx2"]["ymm"] > 0, counts  # the copies really are AVX-512 / AVX2


def test_static_graph_backward_and_jit_save(op, tmp_path):
    """The layer's prologue under to_static (forward + backward through the grad op) and after jit.save/load."""
    import paddleformers.transformers.configuration_utils as cu

    cfg, attn, q_phys, k, cos, sin = make_case(SHAPES[2])
    attn.config.vha_fused_prologue = True

    class Prologue(paddle.nn.Layer):
        def __init__(self, attn):
            super().__init__()
            self.attn = attn

        def forward(self, q_phys, k, cos, sin):
            return self.attn.prologue(q_phys, k, cos, sin)

    layer = Prologue(attn)
    dyn_q, dyn_k = [to_numpy(t) for t in layer(q_phys, k, cos, sin)]
    B_, S_, h_p, r = q_phys.shape
    spec = [paddle.static.InputSpec([None, None, h_p, r], "float32"),
            paddle.static.InputSpec([None, None, k.shape[2], k.shape[3]], "float32"),
            paddle.static.InputSpec([None, None, k.shape[3]], "float32"),
            paddle.static.InputSpec([None, None, k.shape[3]], "float32")]
    paddle.jit.ignore_module([cu])  # PaddleFormers' config __getattribute__ recursion under to_static
    static = paddle.jit.to_static(layer, input_spec=spec, full_graph=True)
    q_phys.stop_gradient = False
    sq, sk = static(q_phys, k, cos, sin)
    assert rel_err(to_numpy(sq), dyn_q, "static q vs dynamic") == 0.0
    assert rel_err(to_numpy(sk), dyn_k, "static k vs dynamic") == 0.0
    (sq.sum() + (sk * sk).sum()).backward()
    static_grad = to_numpy(q_phys.grad)
    q_phys.clear_gradient()
    dq, dk = layer(q_phys, k, cos, sin)
    (dq.sum() + (dk * dk).sum()).backward()
    assert rel_err(static_grad, to_numpy(q_phys.grad), "static dq_phys vs dynamic") <= 1e-6

    path = str(tmp_path / "prologue")
    paddle.jit.save(static, path)
    ops = open(path + ".json").read()
    assert "vha_prologue" in ops  # the saved program holds the custom op, not the composed chain
    loaded = paddle.jit.load(path)
    lq, lk = loaded(q_phys.detach(), k, cos, sin)
    assert rel_err(to_numpy(lq), dyn_q, "jit.load q vs dynamic") == 0.0
    assert rel_err(to_numpy(lk), dyn_k, "jit.load k vs dynamic") == 0.0


def test_layer_uses_fused_op_by_default_and_agrees(op):
    cfg = tiny_config()
    assert cfg.vha_fused_prologue is None  # auto
    Qwen3VHAAttention(cfg, 0)  # builds with the default (auto) switch
    assert dispatch.should_use_fused(cfg.vha_fused_prologue, paddle.randn([1, 1, 2, 16]))
    _, attn2, q_phys, k, cos, sin = make_case(SHAPES[3])
    comp = [to_numpy(t) for t in run(attn2, q_phys, k, cos, sin, fused=False)]
    fused = [to_numpy(t) for t in run(attn2, q_phys, k, cos, sin, fused=None)]
    assert rel_err(fused[0], comp[0], "layer q auto vs composed") <= 1e-6
    assert rel_err(fused[1], comp[1], "layer k auto vs composed") <= 1e-6


def test_fallback_logs_one_line_and_true_requires_op(monkeypatch, caplog):
    """An unavailable op: None falls back with exactly one logged line, True raises, False stays silent."""
    cfg, attn, q_phys, k, cos, sin = make_case(SHAPES[2])
    ref = [to_numpy(t) for t in run(attn, q_phys, k, cos, sin, fused=False)]
    monkeypatch.setitem(op_loader._state, "tried", True)
    monkeypatch.setitem(op_loader._state, "mod", None)
    monkeypatch.setitem(op_loader._state, "error", "OSError: simulated build failure")
    monkeypatch.setattr(dispatch, "_warned", set())
    with caplog.at_level(logging.WARNING, logger="paddle_vha.kernels.dispatch"):
        out1 = [to_numpy(t) for t in run(attn, q_phys, k, cos, sin, fused=None)]
        out2 = [to_numpy(t) for t in run(attn, q_phys, k, cos, sin, fused=None)]
        run(attn, q_phys, k, cos, sin, fused=False)
    lines = [r.getMessage() for r in caplog.records if r.name == "paddle_vha.kernels.dispatch"]
    print(lines)
    assert len(lines) == 1 and "simulated build failure" in lines[0] and "composed path" in lines[0]
    np.testing.assert_array_equal(out1[0], ref[0])
    np.testing.assert_array_equal(out2[1], ref[1])
    with pytest.raises(op_loader.FusedPrologueUnavailable, match="simulated build failure"):
        run(attn, q_phys, k, cos, sin, fused=True)


def test_default_keeps_composed_where_kernels_are_not_measured_faster(op, monkeypatch, caplog):
    """On a CPU architecture where the kernels are not measured faster (anything but x86-64), the default (None)
    keeps the composed path with one logged line; True still runs the op; results equal the composed path."""
    import platform

    cfg, attn, q_phys, k, cos, sin = make_case(SHAPES[2])
    ref = [to_numpy(t) for t in run(attn, q_phys, k, cos, sin, fused=False)]
    monkeypatch.setattr(platform, "machine", lambda: "aarch64")
    monkeypatch.setattr(dispatch, "_warned", set())
    with caplog.at_level(logging.WARNING, logger="paddle_vha.kernels.dispatch"):
        out = [[to_numpy(t) for t in run(attn, q_phys, k, cos, sin, fused=None)] for _ in range(2)]
    lines = [r.getMessage() for r in caplog.records if r.name == "paddle_vha.kernels.dispatch"]
    print(lines)
    assert len(lines) == 1 and "not measured faster" in lines[0] and "aarch64" in lines[0], lines
    np.testing.assert_array_equal(out[1][0], ref[0])  # bit-identical: it is the composed path
    assert dispatch.should_use_fused(True, q_phys)
    assert not dispatch.should_use_fused(None, q_phys)


def test_default_keeps_composed_on_gpu_until_the_paddle_op_ran_on_one(op, monkeypatch, caplog):
    """On a GPU tensor the default (None) uses the composed path with one logged line until the Paddle CUDA op has run
    on a GPU (its kernels passed tools/gpu_check.py through PyTorch: docs/prologue.md); True still asks for the op.
    A stand-in tensor with a GPU place: this machine has no GPU."""
    import types

    gpu_x = types.SimpleNamespace(place=types.SimpleNamespace(is_cpu_place=lambda: False, is_gpu_place=lambda: True),
                                  dtype=paddle.bfloat16)
    reason = dispatch.fused_not_faster_reason(gpu_x)
    assert reason is not None and "Paddle CUDA op has never run on a GPU" in reason
    monkeypatch.setattr(dispatch, "_warned", set())
    monkeypatch.setattr(dispatch, "fused_unavailable_reason", lambda x=None: None)  # as if the CUDA kernels had loaded
    with caplog.at_level(logging.WARNING, logger="paddle_vha.kernels.dispatch"):
        assert not dispatch.should_use_fused(None, gpu_x) and not dispatch.should_use_fused(None, gpu_x)
    lines = [r.getMessage() for r in caplog.records if r.name == "paddle_vha.kernels.dispatch"]
    assert len(lines) == 1 and "Paddle CUDA op has never run on a GPU" in lines[0], lines
    assert dispatch.should_use_fused(True, gpu_x)
    assert dispatch.fused_not_faster_reason(paddle.randn([1])) is None  # CPU here: x86-64, measured faster


def test_config_switch_is_validated():
    for ok in (None, True, False):
        assert tiny_config(vha_fused_prologue=ok).vha_fused_prologue is ok
    with pytest.raises(VHAConfigError, match="vha_fused_prologue"):
        tiny_config(vha_fused_prologue="yes")


def test_bad_shapes_are_refused(op):
    cfg, attn, q_phys, k, cos, sin = make_case(SHAPES[2])
    w = [t.detach() for t in weights(attn)]
    with pytest.raises(Exception, match="premix must be"):
        fused_prologue(q_phys, k, w[0][:, :-1], w[1], w[2], cos, sin, 1e-6)
    with pytest.raises(Exception, match="cos must be"):
        fused_prologue(q_phys, k, *w, cos[:, :-1], sin[:, :-1], 1e-6)


NVCC = shutil.which("nvcc")


@pytest.mark.slow
def test_cuda_sources_compile_with_nvcc_for_sm80_and_sm90(tmp_path):
    """The CUDA kernels compile for Ampere and Hopper: the Paddle op glue as an object, the extern "C" launcher as the
    shared library tools/gpu_check.py builds (sm_80 and sm_90 code plus compute_90 PTX), whose host-only entry point
    answers through ctypes here. Compiled only: nothing built from CUDA runs on this machine (the tensor-core
    instructions themselves are checked in the SASS: tests/test_cuda_emulation.py)."""
    if NVCC is None:
        pytest.skip("nvcc not on PATH: CUDA sources not compiled")
    inc = paddle.sysconfig.get_include()
    csrc = os.path.join(ROOT, "ops", "csrc")
    archs = ["sm_80", "sm_90"]
    gencode = [f for a in archs for f in ("-gencode", f"arch=compute_{a[3:]},code={a}")]
    common = ["-std=c++17", "-O2", f"-I{csrc}", "-Xcompiler", "-fPIC", "--expt-relaxed-constexpr"]
    so = tmp_path / "libvha_prologue.so"
    jobs = {  # flags that work with Paddle's headers: see /work/shared/notes/platform-facts.md
        "cuda/op_cuda.cu": ([f"-I{inc}", f"-I{inc}/third_party", "-DPADDLE_WITH_CUDA", "-DPADDLE_NO_PYTHON",
                             "-DVHA_WITH_CUDA", "-c"], tmp_path / "glue.o"),
        # uncompressed fatbin (-compress-mode=none) so that the embedded PTX can be seen
        "cuda/c_api.cu": (["-shared", "-gencode", "arch=compute_90,code=compute_90", "-compress-mode=none"], so),
    }
    import concurrent.futures

    def build(src):
        extra, out = jobs[src]
        cmd = [NVCC, *common, *gencode, *extra, os.path.join(csrc, src), "-o", str(out)]
        return src, out, subprocess.run(cmd, capture_output=True, text=True, timeout=900)

    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        built = list(pool.map(build, jobs))
    for src, out, res in built:
        print(src, "rc", res.returncode, res.stderr[-1500:])
        assert res.returncode == 0, res.stderr[-4000:]
        blob = out.read_bytes()
        for a in archs:  # each embedded cubin records its ptxas target
            assert f"-arch {a}".encode() in blob, (src, a)
    assert b".target sm_90" in so.read_bytes()  # the PTX for newer GPUs to JIT

    import ctypes

    lib = ctypes.CDLL(str(so))
    lib.vha_prologue_backward_workspace.argtypes = [ctypes.c_int] + [ctypes.c_long] * 6
    lib.vha_prologue_backward_workspace.restype = ctypes.c_size_t
    B, S, h_p, h_kv, r, d = 1, 16384, 8, 2, 128, 128
    rows = B * S * h_p  # 131072 rows: 128 chunks of 1024 rows for dW; bwd_rows runs 1024 blocks (its cap)
    chunks, blocks = 128, 1024
    # fp32: dL/du, one dW partial per row chunk, one pair of norm-weight partials per block (all 256-aligned)
    want = 4 * (rows * h_kv * d + chunks * h_kv * r * d + blocks * 2 * d)
    assert lib.vha_prologue_backward_workspace(2, B, S, h_p, h_kv, r, d) == want
    assert lib.vha_prologue_backward_workspace(1, B, S, h_p, h_kv, r, d) == 2 * want  # fp64 sums


def test_gpu_check_selftest_table_and_a_paddle_free_oracle():
    """`python tools/gpu_check.py --selftest-table`, from the checkout's root as on the GPU machine, needs no GPU and no
    PyTorch: the bytes model, the table and both target lines on made-up timings. The float64 oracle it shares with
    these tests (tools/prologue_check/oracle.py) imports neither paddle nor paddle_vha nor torch."""
    r = subprocess.run([sys.executable, os.path.join("tools", "gpu_check.py"), "--selftest-table"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    print(r.stdout)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = r.stdout.splitlines()
    assert lines[2].startswith("| tokens | fused fwd us | composed fwd us |")
    assert len([ln for ln in lines if ln.startswith("| ")]) == 2 + 7  # header, rule, one row per default token count
    assert lines[-2].startswith("target forward >= 75% of copy bandwidth at >= 4K tokens: ")
    assert lines[-1].startswith("target forward+backward >= 2x faster than the composed chain")
    code = ("import sys; from prologue_check import oracle; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'paddle', 'paddle_vha', 'torch'}))")
    r = subprocess.run([sys.executable, "-c", code], cwd=os.path.join(ROOT, "tools"), capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stdout + r.stderr[-2000:]
