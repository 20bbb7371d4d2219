"""tools/convert_to_vha.py --premix off (the research fork's kv_postmix_only): stock Qwen3 -> Qwen3-VHA without Premix.

Every query head is kept as it is (no Premix), the KV heads of each new group are merged, Postmix starts as the
identity. Keeping the KV heads is exact: the float64 oracle of the converted checkpoint equals the stock-Qwen3 oracle of
the original to 1e-10; merging them (GQA-4 -> 2, MHA-8 -> 2) is approximate and the tool prints the KL."""
import json
import os

import numpy as np
import paddle
import pytest
from paddleformers.transformers import Qwen3Config, Qwen3ForCausalLM

import oracle
from _utils import rel_err, validate_vha_checkpoint
from paddle_vha import Qwen3VHAForCausalLM
from test_convert import SHAPE, _refused, digest, kl_table, logits, run_tool, stock  # noqa: F401  (fixture)
from test_fold import read_state


def _oracle_logits(path, ids, vha):
    raw = json.load(open(os.path.join(path, "config.json")))
    if raw.get("rope_theta") is None:
        raw["rope_theta"] = (raw.get("rope_parameters") or {})["rope_theta"]
    state = read_state(path)
    return (oracle.causal_lm if vha else oracle.stock_causal_lm)(ids, state, raw)[0]


@pytest.fixture(scope="module")
def mha(tmp_path_factory):
    """A stock MHA Qwen3 (8 query heads, 8 KV heads), 2 layers."""
    paddle.seed(5)
    path = str(tmp_path_factory.mktemp("mha") / "qwen3")
    model = Qwen3ForCausalLM(Qwen3Config(**{**SHAPE, "num_attention_heads": 8, "num_key_value_heads": 8,
                                            "num_hidden_layers": 2}))
    for name, p in model.named_parameters():
        if "norm" in name:
            p.set_value(1.0 + paddle.randn(p.shape) * 0.3)
    model.save_pretrained(path)
    return path


@pytest.mark.parametrize("source", ["gqa4", "mha8"])
def test_premix_off_keeping_kv_heads_is_exact(tmp_path, stock, mha, source):  # noqa: F811
    src, kv = (stock, "4") if source == "gqa4" else (mha, "8")
    out = str(tmp_path / "off")
    before = digest(src)
    r = run_tool(src, out, "--kv-heads", kv, "--premix", "off", "--dtype", "float64", "--no-progress",
                 "--method", "svd", "--no-compare", "--eval-len", "32")
    assert r.returncode == 0, r.stderr
    assert "no Premix (--premix off)" in r.stdout
    kls = kl_table(r.stdout)
    assert list(kls) == ["svd"] and kls["svd"] < 1e-9, kls
    validate_vha_checkpoint(out)
    cfg = json.load(open(os.path.join(out, "config.json")))
    assert cfg["vha_premix"] is False and cfg["num_key_value_heads"] == int(kv)
    got, want = read_state(out), read_state(src)
    assert not [n for n in got if "premix" in n]
    q = "model.layers.1.self_attn.q_proj.weight"
    assert np.array_equal(got[q], want[q])  # the query heads are kept bit for bit
    ids = np.random.default_rng(2).integers(0, 256, size=(2, 13))
    e = rel_err(_oracle_logits(out, ids, True), _oracle_logits(src, ids, False),
                f"{source} --premix off --kv-heads {kv}: VHA oracle (converted) vs stock oracle (float64)")
    assert e <= 1e-10
    assert digest(src) == before


@pytest.mark.parametrize("source", ["gqa4", "mha8"])
def test_premix_off_merging_kv_heads_prints_the_kl(tmp_path, stock, mha, source):  # noqa: F811
    src = stock if source == "gqa4" else mha
    out = str(tmp_path / "off2")
    r = run_tool(src, out, "--kv-heads", "2", "--premix", "off", "--no-progress", "--eval-len", "32",
                 "--calib-tokens", "512")
    assert r.returncode == 0, r.stderr
    kls = kl_table(r.stdout)
    print(f"{source} -> 2 KV heads, --premix off: KL {kls}")
    assert set(kls) == {"mean", "svd", "calibrated"} and min(kls.values()) > 1e-7, kls
    cfg = json.load(open(os.path.join(out, "config.json")))
    h_q = json.load(open(os.path.join(src, "config.json")))["num_attention_heads"]
    assert cfg["vha_premix"] is False and cfg["num_attention_heads"] == h_q and cfg["num_key_value_heads"] == 2
    validate_vha_checkpoint(out)
    ids = np.random.default_rng(3).integers(0, 256, size=(2, 11))
    a = logits(Qwen3VHAForCausalLM, out, ids)
    e = rel_err(a, _oracle_logits(out, ids, True), f"{source}: Paddle VHA (premix off) fp32 vs float64 oracle")
    assert e <= 1e-5


def test_premix_off_refuses_a_narrow_query_width(tmp_path, stock, capsys):  # noqa: F811
    err = _refused([stock, str(tmp_path / "o"), "--kv-heads", "2", "--premix", "off", "--q-head-dim", "8"], capsys)
    assert "--q-head-dim 8 with --premix off" in err and not os.path.exists(tmp_path / "o")
