"""VHA without Premix (vha_premix: false; the research fork's vha_enable_premix: false, "kv_postmix_only"): its
config (our name and the fork's), its tensors, its tensor-parallel layout and its cost figures, checked against
numbers written from the equations (docs/method.md, "Premix-off VHA"). The layer / model / decode / gradient checks
against the float64 oracle run in tests/test_family_layers.py and tests/test_family_models.py (tests/family_cases.py:
the "nopremix-" cases); the fold in tests/test_fold.py; HF in tests/test_fold_hf.py; conversion in
tests/test_convert_premix_off.py; TP in tests/test_tensor_parallel.py (the premix-off cases)."""
import numpy as np
import paddle
import pytest

import oracle
from _utils import TINY, config_dict, rel_err, tiny_config, to_numpy
from paddle_vha import Qwen3VHAConfig, Qwen3VHAForCausalLM
from paddle_vha.accounting import (arch_from_config, attention_weights_per_layer, forward_flops_per_token,
                                   kv_bytes_per_token, paper_variants)
from paddle_vha.families import family
from paddle_vha.spec.sharding import TensorShard
from paddle_vha.vha import tp_plan
from paddle_vha.vha.config import VHAConfigError


def test_config_our_name_and_the_forks():
    ours = tiny_config(vha_premix=False, num_attention_heads=8)
    assert ours.vha_premix is False and ours.num_physical_heads == 8 and ours.to_dict()["vha_premix"] is False
    # the fork's premix-off config: attn_type vha, num_attention_heads counts the (kept) query heads
    fork = Qwen3VHAConfig(**{**TINY, "num_attention_heads": 8, "attn_type": "vha", "vha_enable_premix": False,
                             "vha_enable_postmix": True})
    assert (fork.vha_premix, fork.num_attention_heads, fork.num_key_value_heads, fork.vha_postmix_rank) == (False, 8,
                                                                                                            2, 4)
    # with Premix the fork counts physical heads: 8 x 2 KV heads = 16 virtual
    with_premix = Qwen3VHAConfig(**{**TINY, "num_attention_heads": 8, "attn_type": "vha", "vha_enable_premix": True})
    assert with_premix.vha_premix is True and with_premix.num_attention_heads == 16
    assert family("qwen3_vha").spec.tensor_shapes(fork)["model.layers.0.self_attn.q_proj.weight"] == (8 * 16, 48)


@pytest.mark.parametrize("fields, needle", [
    (dict(vha_premix=False, vha_q_head_dim=8), "vha_q_head_dim=8 with vha_premix=false"),
    (dict(vha_premix="no"), "vha_premix must be a bool"),
    (dict(vha_premix=False, vha_fused_prologue=True), "vha_fused_prologue=true with vha_premix=false"),
    (dict(attn_type="vha", vha_enable_premix=False, vha_premix=True), "vha_enable_premix=False and vha_premix=True"),
])
def test_config_refusals_one_line(fields, needle):
    with pytest.raises(VHAConfigError) as e:
        Qwen3VHAConfig(**{**TINY, **fields})
    print(e.value)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_tensors_no_premix_and_a_stock_q_proj():
    cfg = tiny_config(vha_premix=False, num_attention_heads=6, attention_bias=True)
    shapes = family("qwen3_vha").spec.tensor_shapes(cfg)
    p = "model.layers.0.self_attn."
    assert not [n for n in shapes if "premix" in n]
    assert shapes[p + "q_proj.weight"] == (6 * 16, 48) and shapes[p + "q_proj.bias"] == (6 * 16,)
    assert shapes[p + "vha_postmix_U"] == shapes[p + "vha_postmix_V"] == (6, 4)
    model = Qwen3VHAForCausalLM(cfg)
    assert not [n for n, _ in model.named_parameters() if "premix" in n]


def test_model_matches_the_oracle_from_its_checkpoint(tmp_path):
    """Query head j reads KV head j // (H_v / H_kv) (stock GQA pairing), Postmix mixes the H_v outputs: the saved
    model's logits against the float64 oracle on its on-disk tensors."""
    from test_fold import make_vha, read_state

    cfg, model = make_vha(tmp_path / "m", vha_premix=False, num_attention_heads=6, num_key_value_heads=3,
                          attention_bias=True)
    ids = np.random.default_rng(0).integers(0, cfg.vocab_size, size=(2, 9))
    ref, _ = oracle.causal_lm(ids, read_state(tmp_path / "m"), config_dict(cfg))
    got = to_numpy(model(paddle.to_tensor(ids), return_dict=True).logits)
    assert rel_err(got, ref, "premix-off model fp32 vs float64 oracle") <= 1e-5


@pytest.mark.parametrize("t", [2, 4])
def test_tp_plan_splits_q_proj_by_head(t):
    cfg = tiny_config(vha_premix=False, num_attention_heads=8)  # H_kv = 2: split at t = 2, replicated at t = 4
    for rank in range(t):
        lay = tp_plan.attention_layout(cfg, t, rank, 0)
        assert lay.physical == lay.heads == (rank * 8 // t, (rank + 1) * 8 // t) and lay.premix is False
        plan = tp_plan.layer_plan(cfg, t, rank, 0)
        assert plan.params["self_attn.q_proj.weight"] == TensorShard(1)  # column-parallel ([in, out] in memory)
        assert "self_attn.q_proj" not in plan.column_slices and "self_attn.vha_premix_weight" not in plan.params
        assert plan.attributes["self_attn"]["num_physical_heads"] == 8 // t
        assert plan.collectives == {"self_attn.postmix_reduce": "all_reduce_partial"}


def test_cost_from_the_equations():
    """1.7B shape (h 2048, H_v 16, d 128), 2 KV heads, R 4: q_proj H_v*d*h, k/v 2*H_kv*d*h, o_proj h*H_v*d, Postmix
    2*H_v*R; KV bytes as VHA's (2 heads x d x 2 tensors x 2 B = 1 KB); folded = stock GQA-2 with 16 heads."""
    v = {a.label: a for a in paper_variants("1.7b")}
    off, folded, vha = v["VHA premix-off (trained)"], v["VHA premix-off (folded)"], v["VHA (trained)"]
    h, hv, d, kv, R = 2048, 16, 128, 2, 4
    w = attention_weights_per_layer(off)
    print(w)
    assert w["q_proj"] == hv * d * h and w["k_proj"] == w["v_proj"] == kv * d * h and w["o_proj"] == h * hv * d
    assert w["postmix"] == 2 * hv * R and "premix" not in w
    assert kv_bytes_per_token(off, 2) == kv_bytes_per_token(vha, 2) == kv_bytes_per_token(folded, 2) == 1024
    f_off, f_fold = forward_flops_per_token(off, seq_len=4096), forward_flops_per_token(folded, seq_len=4096)
    print(f"premix-off forward GFLOP/token {f_off['total'] / 1e9:.4f}, folded {f_fold['total'] / 1e9:.4f}")
    # Postmix is the only difference: 2 GEMMs of 2*H_v*R*d FLOPs per layer, 28 layers
    assert f_off["total"] - f_fold["total"] == pytest.approx(28 * 2 * 2 * hv * R * d)
    from_cfg = arch_from_config({**TINY, "model_type": "qwen3_vha", "vha_premix": False, "vocab_size": 97,
                                 "num_attention_heads": 4})
    assert from_cfg.kind == "vha_nopremix" and from_cfg.physical_heads == 4
