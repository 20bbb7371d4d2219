"""RoPE scaling (linear, dynamic NTK, YaRN, Llama 3) as Qwen3 and Llama define it: a float64 numpy reference written from the
definitions below (importing nothing from paddle_vha) against PaddleFormers' Qwen3RotaryEmbedding (what the trained
model uses), against paddle_vha.qwen3.rope_scaling (what the exported graph uses), and an export of each type whose
self-validation (onnxruntime with its KV cache vs PaddleFormers) passes, while the same graph without the scaling is
far off.

The definitions (d = head_dim, i = 0, 2, .., d - 2, theta = rope_theta, M = max_position_embeddings, f = factor):
    linear : inv_freq_i = theta^(-i/d) / f
    dynamic: for a call of length L, theta' = theta * (f max(L, M) / M - (f - 1))^(d / (d - 2)); inv_freq_i = theta'^(-i/d)
    yarn   : low / high = the dimension at which a wave makes beta_fast / beta_slow turns over the original context
             O (d ln(O / (2 pi b)) / (2 ln theta)), floored / ceiled; ramp_j = clip((j - low) / (high - low), 0, 1);
             inv_freq_j = theta^(-2j/d) / f * ramp_j + theta^(-2j/d) * (1 - ramp_j); cos and sin times 0.1 ln f + 1.
    llama3 : with the wavelength w_j = 2 pi theta^(2j/d), original context O, low / high frequency factors l < h: a
             wave shorter than O / h keeps theta^(-2j/d), one longer than O / l takes theta^(-2j/d) / f, and between
             them s_j = (O / w_j - l) / (h - l) blends the two: (1 - s_j) theta^(-2j/d) / f + s_j theta^(-2j/d).
"""
from __future__ import annotations

import math

import numpy as np
import paddle
import pytest

from _utils import TINY
from hostile import refused, save_stock, tree


def reference_rope(kind, theta, d, m, factor=1.0, seq_len=None, original=None, beta_fast=32, beta_slow=1, low=1.0,
                   high=4.0):
    """(inv_freq (d/2,), attention factor) in float64, from the definitions in the module docstring."""
    i = np.arange(0, d, 2, dtype=np.float64)
    plain = theta ** (-i / d)
    if kind == "linear":
        return plain / factor, 1.0
    if kind == "dynamic":
        s = max(seq_len or m, m)
        base = theta * (factor * s / m - (factor - 1)) ** (d / (d - 2))
        return base ** (-i / d), 1.0
    if kind == "yarn":
        o = original or m
        turn = lambda b: d * math.log(o / (2 * math.pi * b)) / (2 * math.log(theta))  # noqa: E731
        low, high = max(math.floor(turn(beta_fast)), 0), min(math.ceil(turn(beta_slow)), d - 1)
        ramp = np.clip((np.arange(d // 2) - low) / (high - low), 0, 1)
        return plain / factor * ramp + plain * (1 - ramp), 0.1 * math.log(factor) + 1.0
    if kind == "llama3":
        out = np.empty_like(plain)
        for j, p in enumerate(plain):
            wave = 2 * math.pi / p
            if wave < original / high:
                out[j] = p
            elif wave > original / low:
                out[j] = p / factor
            else:
                s = (original / wave - low) / (high - low)
                out[j] = (1 - s) * p / factor + s * p
        return out, 1.0
    return plain, 1.0


CASES = {  # rope_scaling as config.json gives it (the legacy "type" key for one of them)
    "linear": {"rope_type": "linear", "factor": 4.0},
    "dynamic": {"type": "dynamic", "factor": 2.0},
    "yarn": {"rope_type": "yarn", "factor": 4.0},
    "yarn-original": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
    # O = 64 puts the 8 frequencies of head_dim 16 (wavelengths 6.3 .. 20,000) in all three bands
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64},
}
KIND = {"linear": "linear", "dynamic": "dynamic", "yarn": "yarn", "yarn-original": "yarn", "llama3": "llama3"}


def _cfg(case, m=256):
    from paddleformers.transformers import Qwen3Config

    return Qwen3Config(**dict(TINY, max_position_embeddings=m, rope_scaling=dict(CASES[case])))


@pytest.mark.parametrize("case", list(CASES))
def test_scaled_rope_matches_the_definition(case):
    """PaddleFormers' rotary tables (the trained model's) and paddle_vha.qwen3.rope_scaling (the graph's) against the
    float64 reference: inverse frequencies, attention factor, and cos at positions up to 3 M for dynamic NTK."""
    from paddleformers.transformers.qwen3.modeling import Qwen3RotaryEmbedding

    from paddle_vha.qwen3.rope_scaling import rope_scaling_of

    m = 256
    cfg = _cfg(case, m)
    r = CASES[case]
    want, att = reference_rope(KIND[case], 10000.0, TINY["head_dim"], m, r["factor"],
                               original=r.get("original_max_position_embeddings"))
    ours = rope_scaling_of(cfg)
    rot = Qwen3RotaryEmbedding(cfg)
    pf = rot.inv_freq.numpy().astype(np.float64)
    print(f"{case}: |ours - ref| {np.abs(ours.inv_freq - want).max():.1e}, |PaddleFormers - ref| rel "
          f"{np.abs(pf / want - 1).max():.1e}, attention factor {ours.attention_scaling:.6f} vs {att:.6f} "
          f"(PaddleFormers {rot.attention_scaling:.6f})")
    assert ours.rope_type == KIND[case]
    np.testing.assert_allclose(ours.inv_freq, want, rtol=1e-12)
    np.testing.assert_allclose(pf, want, rtol=2e-6)
    assert abs(ours.attention_scaling - att) < 1e-12 and abs(rot.attention_scaling - att) < 1e-7
    plain = reference_rope("default", 10000.0, TINY["head_dim"], m)[0]
    assert np.allclose(want, plain) == (case == "dynamic")  # it scales (dynamic NTK only past M)
    if case == "dynamic":  # past M the base grows with the call's length, as PaddleFormers recomputes it
        for length in (m, 2 * m, 3 * m):
            pos = paddle.arange(length, dtype="int64").unsqueeze(0)
            cos, _ = rot(paddle.zeros([1], "float32"), pos)
            inv = reference_rope("dynamic", 10000.0, TINY["head_dim"], m, r["factor"], seq_len=length)[0]
            ref_cos = np.cos(np.arange(length)[:, None] * np.concatenate([inv, inv])[None])
            err = np.abs(cos.numpy()[0] - ref_cos).max()
            print(f"dynamic L={length}: max |cos - ref| {err:.1e}")
            assert err < 2e-3 and np.allclose(ours.dynamic_inv_freq(length), inv, rtol=1e-12)


HF_ROPE = r"""
import json, sys
from transformers import LlamaConfig, Qwen3Config
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
out = {}
for name, (fields, seq_len) in json.loads(sys.argv[1]).items():
    cfg = (LlamaConfig if fields["rope_scaling"].get("rope_type") == "llama3" else Qwen3Config)(**fields)
    inv, att = ROPE_INIT_FUNCTIONS[cfg.rope_scaling["rope_type"]](cfg, "cpu", seq_len=seq_len)
    out[name] = [inv.double().tolist(), float(att)]
print(json.dumps(out))
"""


def test_scaled_rope_matches_hugging_face(hf_python, tmp_path):
    """Hugging Face transformers 4.57's Qwen3 RoPE initialisers (its side environment) against the same float64
    reference, for each type (dynamic NTK also at a call of 3 M)."""
    import json
    import subprocess

    m = 256
    asked = {case: (dict(TINY, max_position_embeddings=m, rope_scaling=dict(CASES[case])), None) for case in CASES}
    asked["dynamic-3M"] = (asked["dynamic"][0], 3 * m)
    res = subprocess.run([hf_python, "-c", HF_ROPE, json.dumps(asked)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    got = json.loads(res.stdout.strip().splitlines()[-1])
    for name, (inv, att) in got.items():
        case = name.replace("-3M", "")
        r = CASES[case]
        want, want_att = reference_rope(KIND[case], 10000.0, TINY["head_dim"], m, r["factor"],
                                        seq_len=asked[name][1], original=r.get("original_max_position_embeddings"))
        err = np.abs(np.array(inv) / want - 1).max()
        print(f"{name}: transformers vs reference, inv_freq rel {err:.1e}, attention factor {att:.6f} vs "
              f"{want_att:.6f}")
        assert err < 2e-6 and abs(att - want_att) < 1e-6


@pytest.mark.parametrize("case", ["linear", "dynamic", "yarn-original", "llama3"])
def test_export_carries_the_scaled_rope(tmp_path, case):
    """The export of a scaled-RoPE checkpoint passes its self-validation against PaddleFormers (onnxruntime with its
    KV cache; for dynamic NTK the text passes max_position_embeddings = 16, where the base changes every step, and
    PaddleFormers decodes through its cache as its generate does); the graph built with plain RoPE is far off."""
    from paddle_vha.export.onnx_export import export_onnx
    from paddle_vha.export.plan import serving_plan
    from paddle_vha.export.reference import CheckpointTensors
    from paddle_vha.export.validation import reference_run

    m = 16 if case == "dynamic" else 256  # yarn-original: 256 = factor x its original 64, as both libraries need
    save = save_llama if case == "llama3" else save_stock  # Llama 3's scaling on the Llama base
    src = save(tmp_path / "in", max_position_embeddings=m, rope_scaling=dict(CASES[case]))
    lines = []
    val = export_onnx(src, str(tmp_path / "out"), decode_steps=12, log=lines.append)
    print("\n".join(lines))
    assert val.max_abs <= 1e-4 and val.tokens_match
    assert any(ln.startswith("validation:") and f"RoPE scaling {KIND[case]}" in ln for ln in lines)
    # the same weights through the default RoPE: the scaling visibly changes the logits
    plan = serving_plan(src)
    length = 11 + 12  # the validation's text; past M = 16 for dynamic NTK
    prompt = np.random.default_rng(0).integers(0, TINY["vocab_size"], (2, length)).astype(np.int64)
    scaled = reference_run(plan, CheckpointTensors(plan.folder), prompt, 0).prefill
    plain_src = save(tmp_path / "plain", max_position_embeddings=m)
    plain_plan = serving_plan(plain_src)
    plain = reference_run(plain_plan, CheckpointTensors(plan.folder), prompt, 0).prefill
    gap = np.abs(scaled - plain).max()
    print(f"{case}: max |logits(scaled RoPE) - logits(plain RoPE)| = {gap:.2e}")
    assert gap > 100 * val.max_abs


def save_llama(path, **overrides):
    """A stock Llama checkpoint over TINY (hidden = heads x head_dim, as PaddleFormers' Llama needs)."""
    from paddle_vha.families import family

    paddle.seed(4)
    fam = family("llama")
    fam.model_class(fam.config_class(**dict(TINY, hidden_size=64, tie_word_embeddings=False, **overrides))
                    ).save_pretrained(str(path))
    return str(path)


REFUSED = {
    "longrope": ({"rope_type": "longrope", "factor": 2.0, "short_factor": [1.0] * 8, "long_factor": [2.0] * 8},
                 "rope_type 'longrope' is not implemented"),
    "llama3-incomplete": ({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0},
                          "llama3: high_freq_factor must be a finite number > 0"),
    "unknown": ({"rope_type": "magic", "factor": 2.0}, "rope_type 'magic' is not implemented"),
    "yarn-ambiguous": ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32},
                       "PaddleFormers 1.0.0 scales by the ratio"),
    "factor-nan": ({"rope_type": "linear", "factor": float("nan")}, "factor must be a finite number >= 1"),
    "factor-missing": ({"rope_type": "yarn"}, "factor must be a finite number >= 1"),
    "parameters-null": (None, "rope_parameters is null"),
    "disagree": ({"rope_type": "linear", "factor": 2.0}, "rope_parameters (default, factor None) and rope_scaling (linear, factor 2.0) disagree"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_export_refuses_a_rope_it_does_not_implement(tmp_path, capsys, case):
    """A RoPE type the graph does not implement, or a YaRN config PaddleFormers and transformers read differently
    (Qwen3's own recipe, factor 4 over 32768 with max_position_embeddings 40960), is refused in one line before
    anything is exported."""
    from hostile import edit_config
    from paddle_vha.cli.export_onnx import main

    src = save_stock(tmp_path / "in", max_position_embeddings=64)
    scaling, needle = REFUSED[case]
    if case == "parameters-null":  # a null beside a scaling (PaddleFormers would read the null and fail)
        edit_config(src, rope_scaling={"rope_type": "linear", "factor": 2.0}, rope_parameters=None)
    elif case == "disagree":  # PaddleFormers' saved rope_parameters (default) beside a user's HF-style rope_scaling
        edit_config(src, rope_scaling=scaling)
    else:
        edit_config(src, rope_scaling=scaling, rope_parameters=dict(scaling, rope_theta=10000.0))  # both agree
    before = tree(tmp_path)
    refused(main, [src, str(tmp_path / "out"), "--decode-steps", "1"], capsys, needle)
    assert tree(tmp_path) == before
