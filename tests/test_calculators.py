"""KV-cache and FLOP calculators: the VHA article's published figures, agreement with real models, the CLIs.

The pinned numbers below are the article's (seeds/000_…, "The bill, in bytes" and "What it costs"), not outputs
of our code: 4 KB vs 1 KB vs 1.12 KB per token per layer at 1.7B in bf16; training-FLOP deltas 0.70 G (MHA vs GQA)
and 0.83 G (VHA vs GQA-8) at 1.7B, 1.85 G at 4B; q_proj 2,129,920 weights as trained vs 4,194,304 as served.
"""
import json
import os
import subprocess
import sys

import numpy as np
import paddle
import pytest

from paddle_vha.accounting import (
    Arch,
    ArchError,
    arch_from_config,
    attention_weights_per_layer,
    attention_parameters_per_layer,
    fmt_bytes,
    fold_vha,
    forward_flops_per_token,
    kv_bytes_per_token,
    model_weights,
    paper_variants,
    query_weights_per_layer,
    training_flops_per_token,
)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KV_CALC = os.path.join(ROOT, "tools", "kv_calc.py")
FLOPS = os.path.join(ROOT, "tools", "flops.py")


def variants(shape, **kw):
    return {a.label: a for a in paper_variants(shape, **kw)}


def train_g(a, **kw):
    return training_flops_per_token(a, seq_len=4096, **kw)["total"] / 1e9


# ---- the article's figures ------------------------------------------------------------------------------------


def test_kv_bytes_at_1_7b_bf16():
    v = variants("1.7b")
    assert kv_bytes_per_token(v["GQA-8"], 2) == 4096 and fmt_bytes(4096) == "4 KB"
    assert kv_bytes_per_token(v["VHA (trained)"], 2) == 1024 == kv_bytes_per_token(v["VHA (folded)"], 2)
    assert kv_bytes_per_token(v["MLA"], 2) == 1152  # (512 latent + 64 RoPE key) x 2 B
    assert fmt_bytes(kv_bytes_per_token(v["MLA"], 2)) == "1.12 KB"
    assert kv_bytes_per_token(v["GQA-8"], 2) / kv_bytes_per_token(v["VHA (folded)"], 2) == 4
    assert kv_bytes_per_token(v["GQA-8"], 2, all_layers=True) == 4096 * 28


def test_training_flop_deltas():
    v17, v4 = variants("1.7b"), variants("4b")
    assert round(train_g(v17["GQA-8"]) - train_g(v17["MHA-12"]), 2) == 0.70
    assert round(train_g(v17["GQA-8"]) - train_g(v17["VHA (trained)"]), 2) == 0.83
    assert round(train_g(v4["GQA-8"]) - train_g(v4["VHA (trained)"]), 2) == 1.85
    # the deltas do not depend on the MLP width or the LM head (only attention-side terms differ)
    v = variants("1.7b", intermediate_size=1234)
    assert round(train_g(v["GQA-8"], lm_head=False) - train_g(v["VHA (trained)"], lm_head=False), 2) == 0.83


def test_article_decomposition_of_vha_saving_at_1_7b():
    v = variants("1.7b")
    p = training_flops_per_token(v["VHA (trained)"])
    q = training_flops_per_token(v["GQA-8"])
    assert round((q["q_proj"] - p["q_proj"]) / 1e9, 2) == 0.35  # halving W_Q
    assert round((q["k_proj"] + q["v_proj"] - p["k_proj"] - p["v_proj"]) / 1e9, 2) == 0.53  # K/V 8 -> 2 heads
    assert round((p["premix"] + p["postmix"]) / 1e9, 3) == 0.047  # added back


def test_query_weights_trained_vs_served():
    v = variants("1.7b")
    assert query_weights_per_layer(v["VHA (trained)"]) == 2_129_920
    assert query_weights_per_layer(v["VHA (folded)"]) == 4_194_304 == query_weights_per_layer(v["GQA-8"])


def test_paper_table5_totals_under_stated_assumption():
    """The article quotes Table 5's totals (10.61, 9.91, 9.78 G at 1.7B) and '7.9%' / '0.18 of 3.54 G, 5.0%'.
    They come out of our convention with an MLP width of 5504 and no LM head (an inference, docs/calculators.md)."""
    v = variants("1.7b", intermediate_size=5504)
    t = {k: train_g(a, lm_head=False) for k, a in v.items()}
    assert (round(t["GQA-8"], 2), round(t["MHA-12"], 2), round(t["VHA (trained)"], 2)) == (10.61, 9.91, 9.78)
    assert round((t["GQA-8"] - t["VHA (trained)"]) / t["GQA-8"], 3) == 0.079
    fwd = lambda a: forward_flops_per_token(a, lm_head=False)["total"] / 1e9  # noqa: E731
    assert round(fwd(v["GQA-8"]), 2) == 3.54
    assert round(fwd(v["GQA-8"]) - fwd(v["VHA (folded)"]), 2) == 0.18
    assert round((fwd(v["GQA-8"]) - fwd(v["VHA (folded)"])) / fwd(v["GQA-8"]), 3) == 0.050


# ---- agreement with real models and configs -------------------------------------------------------------------


def _tiny_vha_cfg():
    from paddle_vha import Qwen3VHAConfig

    return Qwen3VHAConfig(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                          num_attention_heads=8, num_key_value_heads=2, head_dim=16, vha_q_head_dim=12,
                          vha_postmix_rank=3, max_position_embeddings=64, tie_word_embeddings=False)


def test_counts_match_a_built_model_and_its_cache():
    from paddle_vha import Qwen3VHAForCausalLM

    cfg = _tiny_vha_cfg()
    arch = arch_from_config(cfg.to_dict(), label="tiny")
    assert arch.kind == "vha" and arch.physical_heads == 4 and arch.q_head_dim == 12
    model = Qwen3VHAForCausalLM(cfg)
    norms = cfg.num_hidden_layers * (2 * cfg.hidden_size + 2 * cfg.head_dim) + cfg.hidden_size
    assert model_weights(arch)["total"] + norms == sum(p.size for p in model.parameters())
    layer = dict(model.model.layers[0].self_attn.named_parameters())
    assert attention_weights_per_layer(arch)["total"] == sum(p.size for n, p in layer.items() if "norm" not in n)
    # with biases and norms (what tools/quickstart.py prints): every parameter of the built layer, and the weights
    # alone once the norms are taken out
    assert attention_parameters_per_layer(arch)["total"] == sum(p.size for p in layer.values())
    assert attention_parameters_per_layer(arch)["total"] - 2 * cfg.head_dim == attention_weights_per_layer(arch)["total"]
    # KV bytes: what the real cache holds after 5 tokens, in fp32 here
    ids = paddle.to_tensor(np.arange(5).reshape(1, 5))
    cache = model(ids, use_cache=True, return_dict=True).past_key_values
    held = sum(int(l.keys.numel()) + int(l.values.numel()) for l in cache.layers) * 4
    assert held == kv_bytes_per_token(arch, 4, all_layers=True) * 5


def test_config_kinds():
    base = dict(hidden_size=2048, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                intermediate_size=6144, vocab_size=151936, tie_word_embeddings=True)
    gqa = arch_from_config({**base, "model_type": "qwen3"})
    assert gqa.kind == "gqa" and kv_bytes_per_token(gqa) == 4096
    assert arch_from_config({**base, "model_type": "qwen3", "num_key_value_heads": 16}).kind == "mha"
    mea = arch_from_config({**base, "model_type": "qwen3_mea", "num_key_value_heads": 2, "mea_kv_heads": 8,
                            "mea_layers": list(range(12, 36 - 8))})
    # an MEA layer caches n_p / n_v of stock; the 12 other layers keep n_v = 8 heads
    assert kv_bytes_per_token(mea) == kv_bytes_per_token(gqa) * 2 / 8
    assert kv_bytes_per_token(mea, all_layers=True) == 1024 * 16 + 4096 * 12
    moe = arch_from_config({**base, "model_type": "qwen3_moe", "num_experts": 128, "num_experts_per_tok": 8,
                            "moe_intermediate_size": 768, "num_key_value_heads": 4})
    dense_mlp = forward_flops_per_token(gqa)["mlp"]
    assert forward_flops_per_token(moe)["mlp"] == 28 * (2 * 3 * 2048 * 768 * 8 + 2 * 2048 * 128) != dense_mlp
    mla = arch_from_config({**base, "model_type": "deepseek_v2", "kv_lora_rank": 512, "qk_rope_head_dim": 64})
    assert mla.kind == "mla" and kv_bytes_per_token(mla) == 1152
    vha = arch_from_config({**base, "model_type": "qwen3_vha", "num_key_value_heads": 2, "vha_postmix_rank": 4})
    assert query_weights_per_layer(vha) == 2_129_920 and query_weights_per_layer(fold_vha(vha)) == 4_194_304
    with pytest.raises(ArchError, match="gated"):
        fold_vha(vha.replace(vha_gated=True))
    with pytest.raises(ArchError, match="hidden_size"):
        arch_from_config({"model_type": "qwen3"})
    with pytest.raises(ArchError, match="multiple"):
        Arch(label="x", kind="gqa", hidden_size=8, num_layers=1, head_dim=4, num_heads=6, num_kv_heads=4,
             intermediate_size=8, vocab_size=8)


# ---- the command lines -----------------------------------------------------------------------------------------


def run(tool, *args):
    return subprocess.run([sys.executable, tool, *args], capture_output=True, text=True, timeout=120, cwd=ROOT)


def test_kv_calc_cli(tmp_path):
    res = run(KV_CALC)
    assert res.returncode == 0, res.stderr
    rows = {line.split("  ")[0]: line for line in res.stdout.splitlines()}
    assert " 4 KB " in rows["GQA-8"] and " 1 KB " in rows["VHA (folded)"] and " 1.12 KB " in rows["MLA"]
    data = json.loads(run(KV_CALC, "4b", "--json", "--dtype", "fp8").stdout)
    assert {r["variant"]: r["bytes_per_token_per_layer"] for r in data}["GQA-8"] == 2048
    cfg = _tiny_vha_cfg()
    (tmp_path / "config.json").write_text(json.dumps(cfg.to_dict()))
    data = json.loads(run(KV_CALC, str(tmp_path), "--json").stdout)
    assert [r["bytes_per_token_per_layer"] for r in data] == [2 * 2 * 16 * 2] * 2  # trained and folded
    # a tools/train.py trainer config is read through its model_config
    data = json.loads(run(KV_CALC, os.path.join(ROOT, "configs", "vha-1.7b.json"), "--json").stdout)
    assert [(r["kind"], r["bytes_per_token_per_layer"]) for r in data] == [("vha", 1024), ("vha_folded", 1024)]
    assert "--context" in run(KV_CALC, "--help").stdout
    for bad in (["9b"], ["--context", "0"], [str(tmp_path / "nope.json")]):
        res = run(KV_CALC, *bad)
        assert res.returncode != 0 and "error:" in res.stderr.strip().splitlines()[-1], res.stderr
        assert "Traceback" not in res.stderr
    (tmp_path / "bad.json").write_text("{")
    res = run(KV_CALC, str(tmp_path / "bad.json"))
    assert res.returncode == 2 and res.stderr.startswith("error:") and "not valid JSON" in res.stderr


def test_flops_cli():
    res = run(FLOPS, "1.7b", "--breakdown")
    assert res.returncode == 0, res.stderr
    assert "net 0.834 G" in res.stdout and "2,129,920" in res.stdout and "4,194,304" in res.stdout
    data = {r["variant"]: r for r in json.loads(run(FLOPS, "4b", "--json").stdout)}
    assert round(data["VHA (trained)"]["training_delta_gflops"], 2) == 1.85
    res = run(FLOPS, "1.7b", "--intermediate-size", "5504", "--no-lm-head")
    assert "0.176 of 3.54 G (5.0%)" in res.stdout
    res = run(FLOPS, "--seq-len", "0")
    assert res.returncode != 0 and "--seq-len must be >= 1" in res.stderr


def test_mea_config_from_the_real_class():
    from paddle_vha.mea.config import Qwen3MEAConfig

    cfg = Qwen3MEAConfig(hidden_size=64, num_hidden_layers=4, intermediate_size=96, head_dim=16, num_attention_heads=8,
                         num_key_value_heads=2, mea_kv_heads=4, mea_layers=[1, 2], vocab_size=97)
    arch = arch_from_config({**cfg.to_dict(), "model_type": "qwen3_mea"})
    assert kv_bytes_per_token(arch, 2) == 2 * 2 * 16 * 2  # an MEA layer caches n_p heads
    expected = sum(2 * cfg.kv_heads_of_layer(i) * 16 * 2 for i in range(4))
    assert kv_bytes_per_token(arch, 2, all_layers=True) == expected
