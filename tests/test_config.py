"""Qwen3VHAConfig: defaults, derived sizes, round trip, and one-line rejection of bad values."""
import json

import pytest

from _utils import TINY, tiny_config
from paddle_vha import Qwen3VHAConfig, Qwen3VHAForCausalLM, VHAConfigError


def test_defaults_follow_the_method():
    cfg = Qwen3VHAConfig(**TINY)
    assert cfg.model_type == "qwen3_vha"
    assert cfg.vha_q_head_dim == cfg.head_dim  # r defaults to d
    assert cfg.vha_postmix_rank == 4
    assert cfg.vha_gated_attention is False
    assert (cfg.vha_premix_init_alpha, cfg.vha_postmix_u_init_std, cfg.vha_postmix_v_init_std) == (0.1, 0.01, 0.0)
    assert cfg.num_physical_heads == TINY["num_attention_heads"] // TINY["num_key_value_heads"]


def test_paper_1p7b_shape():
    cfg = Qwen3VHAConfig(hidden_size=2048, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=2,
                         head_dim=128, intermediate_size=6144, vocab_size=151936)
    assert cfg.num_physical_heads == 8


def test_round_trip_through_json(tmp_path):
    cfg = tiny_config(vha_q_head_dim=8, vha_postmix_rank=3, vha_gated_attention=True)
    cfg.save_pretrained(tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    assert raw["model_type"] == "qwen3_vha"
    assert {k: raw[k] for k in ("vha_q_head_dim", "vha_postmix_rank", "vha_gated_attention")} == {
        "vha_q_head_dim": 8, "vha_postmix_rank": 3, "vha_gated_attention": True}
    back = Qwen3VHAConfig.from_pretrained(tmp_path)
    assert (back.vha_q_head_dim, back.vha_postmix_rank, back.vha_gated_attention) == (8, 3, True)


BAD = [
    (dict(num_attention_heads=5, num_key_value_heads=2), "divisible"),
    (dict(num_key_value_heads=0), "num_key_value_heads"),
    (dict(head_dim=15), "head_dim"),
    (dict(vha_q_head_dim=0), "vha_q_head_dim"),
    (dict(vha_q_head_dim=17), "vha_q_head_dim"),
    (dict(vha_q_head_dim=4.0), "vha_q_head_dim"),
    (dict(vha_postmix_rank=0), "vha_postmix_rank"),
    (dict(vha_postmix_rank=2.5), "vha_postmix_rank"),
    (dict(vha_gated_attention="yes"), "vha_gated_attention"),
    (dict(vha_premix_init_alpha=-0.1), "vha_premix_init_alpha"),
    (dict(vha_postmix_u_init_std=float("nan")), "vha_postmix_u_init_std"),
]


@pytest.mark.parametrize("overrides,needle", BAD, ids=[n for _, n in BAD])
def test_bad_config_is_rejected_with_one_line(overrides, needle):
    with pytest.raises(VHAConfigError) as e:
        tiny_config(**overrides)
    msg = str(e.value)
    print(msg)
    assert needle in msg and "\n" not in msg


@pytest.mark.parametrize("field,value,needle", [
    ("tensor_model_parallel_size", 2, "tensor_model_parallel_size=2"),
    ("fuse_attention_qkv", True, "fuse_attention_qkv"),
])
def test_unsupported_runtime_options_are_refused(field, value, needle):
    cfg = tiny_config()
    setattr(cfg, field, value)  # trainers set these after the config is built
    with pytest.raises(VHAConfigError, match=needle):
        Qwen3VHAForCausalLM(cfg)


def test_auto_classes(tmp_path):
    import paddle_vha.vha.modeling  # noqa: F401  (registers qwen3_vha)
    from paddleformers.transformers import AutoConfig, AutoModelForCausalLM

    cfg = tiny_config()
    assert type(AutoModelForCausalLM.from_config(cfg)).__name__ == "Qwen3VHAForCausalLM"
    Qwen3VHAForCausalLM(cfg).save_pretrained(tmp_path)
    assert isinstance(AutoConfig.from_pretrained(tmp_path), Qwen3VHAConfig)
    # Known PaddleFormers 1.0.0 limitation (docs/method.md): from_pretrained matches the "Qwen3" name prefix.
    assert type(AutoModelForCausalLM.from_pretrained(tmp_path)).__name__ == "Qwen3ForCausalLM"
