"""Qwen3MEAAttention's own algebra and refusals: HLC is the einsum and commutes with RoPE, its GQA init, the head norm,
config refusals, layer lists.

The checks every family gets (forward and gradients against the float64 MEA oracle over a grid of shapes, both
attention backends, the spec against the built layer) are in tests/test_family_layers.py."""
import numpy as np
import paddle
import pytest
from paddleformers.transformers.qwen3.modeling import Qwen3RotaryEmbedding, apply_rotary_pos_emb

import mea_oracle
from _utils import TINY, rel_err, to_numpy
from paddle_vha.mea.attention import Qwen3MEAAttention, hlc
from paddle_vha.mea.config import MEAConfigError, Qwen3MEAConfig, parse_layer_spec
from test_family_layers import build_layer
from test_family_layers import oracle_layer as family_oracle_layer
from test_family_layers import run_layer


def mea_config(**overrides):
    return Qwen3MEAConfig(**{**TINY, **overrides})


def make_layer(B, S, H, n_p, n_v, d, pos, gn, bias, impl="eager"):
    """An MEA layer with every tensor away from its init (tests/family_cases.py), and an input (B, S, h)."""
    return build_layer("qwen3_mea", Qwen3MEAAttention, dict(
        num_attention_heads=H, num_key_value_heads=n_p, mea_kv_heads=n_v, head_dim=d, mea_k_norm_position=pos,
        mea_group_norm=gn, attention_bias=bias), B, S, impl)


def oracle_layer(cfg, tensors, x_np):
    return family_oracle_layer("qwen3_mea", cfg, tensors, x_np)


def test_hlc_is_the_einsum_and_commutes_with_rope():
    """HLC(K)[j] = sum_p K[p] lc[p, j]; RoPE rotates every head of a token by the same angle, so they commute."""
    cfg = mea_config(num_attention_heads=6, num_key_value_heads=2, mea_kv_heads=3)
    B, S, n_p, n_v, d = 2, 11, 2, 3, cfg.head_dim
    k = paddle.randn([B, n_p, S, d])
    lc = paddle.randn([n_p, n_v])
    got = to_numpy(hlc(k, lc))
    ref = np.einsum("bptd,pv->bvtd", to_numpy(k), to_numpy(lc))
    assert rel_err(got, ref, "hlc vs einsum") <= 1e-6
    pos = paddle.to_tensor(np.random.randint(0, 200, size=(B, S)), dtype="int64")
    cos, sin = Qwen3RotaryEmbedding(cfg)(k, pos)
    rot = lambda t: apply_rotary_pos_emb(t, t, cos, sin)[1]  # noqa: E731
    a, b = to_numpy(rot(hlc(k, lc))), to_numpy(hlc(rot(k), lc))
    assert rel_err(a, b, "RoPE(HLC(K)) vs HLC(RoPE(K))") <= 1e-5
    # the oracle's own RoPE agrees: HLC then RoPE == RoPE then HLC in float64
    kn = to_numpy(k).transpose(0, 2, 1, 3)
    a64 = mea_oracle.rope(mea_oracle.hlc(kn, to_numpy(lc)), to_numpy(pos), cfg.rope_theta)
    b64 = mea_oracle.hlc(mea_oracle.rope(kn, to_numpy(pos), cfg.rope_theta), to_numpy(lc))
    assert np.abs(a64 - b64).max() < 1e-12


def test_hlc_init_starts_as_gqa():
    cfg = mea_config(num_attention_heads=6, num_key_value_heads=2, mea_kv_heads=6)
    lc = to_numpy(Qwen3MEAAttention(cfg, 0).mea_k_lc)  # (2, 6): virtual j copies physical j % 2, + N(0, 0.02)
    tile = np.array([[1.0 if j % 2 == p else 0.0 for j in range(6)] for p in range(2)])
    assert np.abs(lc - tile).max() < 0.15 and np.abs(lc - tile).std() > 0.005


def test_head_norm_normalizes_each_head():
    """With mea_group_norm and unit weight, each head of the o_proj input has RMS 1."""
    cfg, attn, x = make_layer(2, 9, 6, 2, 3, 16, "after_hlc", True, False)
    attn.mea_norm.weight.set_value(paddle.ones_like(attn.mea_norm.weight))
    seen = {}

    def grab(layer, inp):
        seen["y"] = to_numpy(inp[0])  # returns None: the input is left as it is

    attn.o_proj.register_forward_pre_hook(grab)
    run_layer(cfg, attn, x)
    y = seen["y"].reshape(2, 9, 6, 16)
    rms = np.sqrt((y ** 2).mean(-1))
    print("per-head RMS range", rms.min(), rms.max())
    assert np.allclose(rms, 1.0, atol=1e-3)


BAD = {
    "n_p > n_v": (dict(num_key_value_heads=4, mea_kv_heads=2), "must be <= mea_kv_heads"),
    "n_v not dividing H": (dict(num_attention_heads=6, num_key_value_heads=2, mea_kv_heads=4), "divisible by mea_kv_heads"),
    "stock heads not dividing H": (dict(mea_stock_kv_heads=3), "divisible by mea_stock_kv_heads"),
    "bad norm position": (dict(mea_k_norm_position="middle"), "mea_k_norm_position must be one of"),
    "layer out of range": (dict(mea_layers=[0, 5]), "mea_layers [5] outside 0..1"),
    "duplicate layers": (dict(mea_layers=[1, 1]), "distinct layer indices"),
    "group norm not bool": (dict(mea_group_norm="yes"), "mea_group_norm must be a bool"),
    "zero virtual heads": (dict(mea_kv_heads=0), "mea_kv_heads must be a positive int"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_config_is_refused_with_one_line(case):
    fields, needle = BAD[case]
    with pytest.raises(MEAConfigError) as e:
        mea_config(**fields)
    print(e.value)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_tensor_parallel_without_the_plan_is_refused():
    cfg = mea_config()
    cfg.tensor_model_parallel_size = 2
    with pytest.raises(MEAConfigError, match="tensor_model_parallel_size=2: Qwen3-MEA is tensor-parallel only through "
                                             "paddle_vha.parallel .*build_tensor_parallel_model"):
        Qwen3MEAAttention(cfg, 0)
    cfg.check_runtime_support(tensor_parallel_plan=True)  # the entry point's check passes


def test_layer_specs():
    assert parse_layer_spec("all", 5) == [0, 1, 2, 3, 4]
    assert parse_layer_spec("deep", 5) == [3, 4]
    assert parse_layer_spec("1-3", 5) == [1, 2, 3]
    assert parse_layer_spec("4,0", 5) == [0, 4]
    for bad, needle in (("2-9", "outside 0..4"), ("x", "must be 'all'"), ("deep", "only 3")):
        with pytest.raises(MEAConfigError, match=needle):
            parse_layer_spec(bad, 5 if bad != "deep" else 3)
