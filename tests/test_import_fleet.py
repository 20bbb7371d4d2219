"""Upstream PaddleFleet VHA configs and checkpoints (paddle_vha/vha/fleet_config.py, tools/import_fleet.py).

The upstream checkpoints here are built from random tensors in upstream's own names, shapes and Paddle [in, out]
layout, and the reference they are checked against is written in this file from upstream's equations (its Premix
einsum strings, M = I + V U^T, the fork's grouped fused qkv), reusing only tests/oracle.py's norm / RoPE / mask.
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from safetensors.numpy import save_file

import oracle
from _utils import config_dict, load_checkpoint_numpy, rel_err
from paddle_vha import Qwen3VHAConfig, VHAConfigError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# D-URing/PaddleFleet, Research/VHA/config/qwen3/Qwen3-1.7B-VHA/config.json at commit
# 7218402d3f17e735412ac0d3267016f8142c8167 (the research fork; num_attention_heads counts physical query heads).
FORK_1P7B = {
    "architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0, "attn_type": "vha",
    "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu", "hidden_size": 2048,
    "initializer_range": 0.02, "intermediate_size": 6144, "max_position_embeddings": 40960, "max_window_layers": 28,
    "model_type": "qwen3", "num_attention_heads": 8, "num_hidden_layers": 28, "num_key_value_heads": 2,
    "rms_norm_eps": 1e-6, "rope_theta": 1000000, "tie_word_embeddings": True, "use_qk_norm": True,
    "vocab_size": 151936, "vha_enable_premix": True, "vha_enable_postmix": True, "vha_postmix_rank": 4,
}

SMALL = dict(vocab_size=97, hidden_size=48, intermediate_size=64, rms_norm_eps=1e-6, rope_theta=10000.0,
             max_position_embeddings=256)


# --- configs -------------------------------------------------------------------------------------------------------

def test_research_fork_config_is_read():
    from paddle_vha.vha.spec import tensor_shapes

    cfg = Qwen3VHAConfig(**FORK_1P7B)
    assert cfg.model_type == "qwen3_vha"
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.num_physical_heads) == (16, 2, 8)  # 8 x 2 virtual
    assert (cfg.vha_q_head_dim, cfg.vha_postmix_rank, cfg.vha_gated_attention, cfg.window_layers()) == (128, 4, False, [])
    shapes = tensor_shapes(cfg)
    assert shapes["model.layers.0.self_attn.q_proj.weight"] == (8 * 128, 2048)
    assert shapes["model.layers.0.self_attn.vha_premix_weight"] == (2, 128, 128)
    assert shapes["model.layers.0.self_attn.vha_postmix_U"] == (16, 4)
    saved = cfg.to_dict()
    assert not any(k in saved for k in ("attn_type", "vha_enable_premix", "use_qk_norm"))
    again = Qwen3VHAConfig(**saved)  # what a saved checkpoint reloads as: the same model
    assert (again.num_attention_heads, again.vha_q_head_dim, again.vha_postmix_rank) == (16, 128, 4)


def upstream(**over):
    return {**SMALL, "use_vha_attention": True, "num_hidden_layers": 5, "num_attention_heads": 8,
            "num_key_value_heads": 2, "head_dim": 16, **over}


@pytest.mark.parametrize("skip_freq, swa", [
    (None, [0, 1, 2, 3, 4]),  # every layer
    (2, [1, 3]),  # layer i unless i % 2 == 0 (0-based)
    (3, [1, 2, 4]),
    ([0, 1, 1, 0, 1], [1, 2, 4]),  # 1 marks a window layer
])
def test_window_attn_skip_freq(skip_freq, swa):
    cfg = Qwen3VHAConfig(**upstream(sliding_window=4, window_attn_skip_freq=skip_freq, add_swa_attention_sink_bias=False))
    assert cfg.window_layers() == swa and cfg.sliding_window == 4
    assert Qwen3VHAConfig(**upstream(window_attn_skip_freq=skip_freq)).window_layers() == []  # no window: none


def test_upstream_defaults_and_names():
    cfg = Qwen3VHAConfig(**upstream(vha_q_lora_rank=12, gated_attention=True, vha_shared_kv=True))
    assert (cfg.vha_q_head_dim, cfg.vha_postmix_rank, cfg.vha_gated_attention, cfg.vha_shared_kv) == (12, 2, True, True)
    assert Qwen3VHAConfig(**upstream()).vha_q_head_dim == 16  # upstream: r defaults to head_dim
    assert Qwen3VHAConfig(**upstream(num_attention_heads=16)).vha_postmix_rank == 4  # H_v // 4
    assert Qwen3VHAConfig(**dict(SMALL, num_attention_heads=8, num_key_value_heads=2, head_dim=16)).vha_postmix_rank == 4
    # window layers: swa_* sizes; upstream's defaults r_w = swa_head_dim, R_w = swa heads // 4
    cfg = Qwen3VHAConfig(**upstream(vha_q_lora_rank=12, sliding_window=4, window_attn_skip_freq=2,
                                    swa_num_attention_heads=4, swa_head_dim=8, swa_rope_theta=500.0,
                                    add_swa_attention_sink_bias=False))
    full, win = cfg.layer_dims(0), cfg.layer_dims(1)
    assert (full.num_heads, full.q_head_dim, full.postmix_rank, full.window) == (8, 12, 2, None)
    assert (win.num_heads, win.num_kv_heads, win.head_dim, win.q_head_dim, win.postmix_rank, win.rope_theta,
            win.window) == (4, 2, 8, 8, 1, 500.0, 4)
    cfg = Qwen3VHAConfig(**upstream(vha_q_lora_rank=12, sliding_window=4, window_attn_skip_freq=2,
                                    add_swa_attention_sink_bias=False))
    assert cfg.layer_dims(1).q_head_dim == 16 and cfg.stock_shaped_window_layers()  # r_w = head_dim upstream
    again = Qwen3VHAConfig(**cfg.to_dict())
    assert [again.layer_dims(i) for i in range(5)] == [cfg.layer_dims(i) for i in range(5)]


@pytest.mark.parametrize("over, needle", [
    (dict(rotary_percent=0.5), "rotary_percent=0.5: partial RoPE"),
    (dict(v_head_dim=32), "v_head_dim=32 differs from head_dim=16"),
    (dict(attention_value_scale=0.5), "attention_value_scale=0.5"),
    (dict(use_qk_norm=False), "use_qk_norm=False"),
    (dict(qk_norm_type="per_layer"), "qk_norm_type='per_layer'"),
    (dict(sliding_window=[4, 4]), "a (left, right) window"),
    (dict(sliding_window=4, window_attn_skip_freq=0), "window_attn_skip_freq must be > 0"),
    (dict(sliding_window=4, window_attn_skip_freq=[1, 0]), "must hold num_hidden_layers=5 values"),
    (dict(use_vha_attention=False), "use_vha_attention=False: not a VHA config"),
    (dict(softmax_scale=0.3), "softmax_scale=0.3"),
    (dict(vha_q_lora_rank=8, vha_q_head_dim=4), "vha_q_lora_rank=8 and vha_q_head_dim=4 disagree"),
    (dict(use_bias=True), "use_bias=True"),
    (dict(num_attention_heads=2, num_key_value_heads=1), "upstream's default num_attention_heads // 4 is 0"),
    (dict(vha_postmix_grouped=True), "DeepSeek-V4"),
])
def test_upstream_refusals(over, needle):
    with pytest.raises(VHAConfigError) as e:
        Qwen3VHAConfig(**{**upstream(), **over})
    print(e.value)
    assert needle in str(e.value) and "\n" not in str(e.value)


# --- upstream's HF-export names and newer fields (hf_export.py, transformer_config.py) ---------------------------

def test_use_gated_attn_is_gated_attention():
    assert Qwen3VHAConfig(**upstream(use_gated_attn=True)).vha_gated_attention is True
    assert Qwen3VHAConfig(**upstream(use_gated_attn=False)).vha_gated_attention is False
    assert Qwen3VHAConfig(**upstream(use_gated_attn=True, gated_attention=True)).vha_gated_attention is True
    with pytest.raises(VHAConfigError, match="use_gated_attn=True and gated_attention=False disagree"):
        Qwen3VHAConfig(**upstream(use_gated_attn=True, gated_attention=False))


@pytest.mark.parametrize("pattern, swa", [(None, [0, 1, 2, 3, 4]), (2, [1, 3]), ([0, 1, 1, 0, 1], [1, 2, 4])])
def test_hybrid_layer_pattern_is_window_attn_skip_freq(pattern, swa):
    cfg = Qwen3VHAConfig(**upstream(sliding_window=4, hybrid_layer_pattern=pattern, add_swa_attention_sink_bias=False))
    same = Qwen3VHAConfig(**upstream(sliding_window=4, window_attn_skip_freq=pattern, add_swa_attention_sink_bias=False))
    assert cfg.window_layers() == same.window_layers() == swa  # upstream's 0-based is_layer_window_attention
    with pytest.raises(VHAConfigError, match="hybrid_layer_pattern=2 and window_attn_skip_freq=3 disagree"):
        Qwen3VHAConfig(**upstream(sliding_window=4, hybrid_layer_pattern=2, window_attn_skip_freq=3))


@pytest.mark.parametrize("ratio, ok", [(0.0, True), (1.0, True), (0.25, True), (0.5, False), (0.75, False)])
def test_head_wise_swa_ratio(ratio, ok):
    """Upstream windows int(ratio * H_kv) of a window layer's KV heads (H_kv = 2 here): 0 or all is Qwen3's layer."""
    raw = upstream(sliding_window=4, window_attn_skip_freq=2, add_swa_attention_sink_bias=False,
                   head_wise_swa_ratio=ratio)
    if ok:
        assert Qwen3VHAConfig(**raw).window_layers() == [1, 3]
    else:
        with pytest.raises(VHAConfigError) as e:
            Qwen3VHAConfig(**raw)
        print(e.value)
        assert f"head_wise_swa_ratio={ratio}: 1 of a window layer's 2 KV heads" in str(e.value)
    assert Qwen3VHAConfig(**upstream(head_wise_swa_ratio=0.5)).window_layers() == []  # no window: upstream ignores it


def test_qk_norm_eps_and_high_precision_rope():
    cfg = Qwen3VHAConfig(**upstream(qk_norm_eps=1e-6))  # = rms_norm_eps (SMALL)
    assert cfg.rms_norm_eps == 1e-6 and "qk_norm_eps" not in cfg.to_dict()
    assert Qwen3VHAConfig(**upstream(qk_norm_eps=None)).rms_norm_eps == 1e-6  # None: falls back to rms_norm_eps
    for value in (True, False):  # a float32-RoPE kernel choice: no tensor, same function; read, not stored
        cfg = Qwen3VHAConfig(**upstream(high_precision_rope=value))
        assert "high_precision_rope" not in cfg.to_dict() and cfg.to_dict() == Qwen3VHAConfig(**upstream()).to_dict()


@pytest.mark.parametrize("over, needle", [
    (dict(qk_norm_eps=1e-5), "qk_norm_eps=1e-05 differs from rms_norm_eps=1e-06"),
    (dict(high_precision_rope="yes"), "high_precision_rope='yes': must be true or false"),
    (dict(head_wise_swa_ratio=1.5), "head_wise_swa_ratio=1.5: upstream's share"),
    (dict(muon_slice_specs={"qkv_proj.weight": "split_head"}), "muon_slice_specs: upstream's Muon-optimizer"),
    (dict(softmax_type="learnable"), "softmax_type='learnable': a sink on every layer is not supported"),
    (dict(softmax_type="off-by-one"), "softmax_type='off-by-one'"),
    (dict(add_full_attention_sink_bias=True), "add_full_attention_sink_bias=True"),
    (dict(add_swa_attention_sink_bias="yes"), "add_swa_attention_sink_bias='yes': must be true or false"),
])
def test_newer_field_refusals(over, needle):
    with pytest.raises(VHAConfigError) as e:
        Qwen3VHAConfig(**{**upstream(), **over})
    print(e.value)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_sink_fields_that_mean_no_sinks_are_read():
    plain = Qwen3VHAConfig(**upstream()).to_dict()
    for over in (dict(softmax_type="vanilla"), dict(add_full_attention_sink_bias=False), dict(muon_slice_specs=None),
                 dict(muon_slice_specs={}), dict(add_swa_attention_sink_bias=False)):
        assert Qwen3VHAConfig(**upstream(**over)).to_dict() == plain, over  # the same model, nothing stored


def test_swa_sink_field_is_read_as_window_attention_sinks():
    """add_swa_attention_sink_bias -> window_attention_sinks where there are window layers; upstream's default is true
    (absent = sinks); without window layers upstream builds no sink and neither does the translation."""
    for over, want in ((dict(add_swa_attention_sink_bias=True), True), (dict(), True),
                       (dict(add_swa_attention_sink_bias=False), False)):
        cfg = Qwen3VHAConfig(**upstream(sliding_window=4, window_attn_skip_freq=2, **over))
        assert cfg.window_attention_sinks is want, over
        assert [cfg.has_sinks(i) for i in range(cfg.num_hidden_layers)] == [want and i % 2 != 0
                                                                           for i in range(cfg.num_hidden_layers)]
        assert "add_swa_attention_sink_bias" not in cfg.to_dict()
    for over in (dict(), dict(add_swa_attention_sink_bias=True)):  # no window layer: no sink
        assert Qwen3VHAConfig(**upstream(**over)).window_attention_sinks is False, over
    with pytest.raises(VHAConfigError, match="add_swa_attention_sink_bias=False and window_attention_sinks=True disagree"):
        Qwen3VHAConfig(**upstream(sliding_window=4, window_attn_skip_freq=2, add_swa_attention_sink_bias=False,
                                  window_attention_sinks=True))


def test_fork_refusals():
    with pytest.raises(VHAConfigError, match="attn_type='mla'"):
        Qwen3VHAConfig(**{**FORK_1P7B, "attn_type": "mla"})
    with pytest.raises(VHAConfigError, match="the fork's gated-Premix design"):
        Qwen3VHAConfig(**{**FORK_1P7B, "vha_premix_alpha_init": 5.0})


# --- upstream checkpoints and their reference forward --------------------------------------------------------------

def _rand(rng, *shape, std=0.2):
    return (rng.standard_normal(shape) * std).astype(np.float32)


def make_paddlefleet(path, seed=0, **over):
    """A PaddleFleet SelfAttentionVHA checkpoint: separate projections, Paddle [in, out] weights, upstream names."""
    rng = np.random.default_rng(seed)
    raw = {**SMALL, "use_vha_attention": True, "model_type": "qwen3", "num_hidden_layers": 3,
           "num_attention_heads": 6, "num_key_value_heads": 2, "head_dim": 16, "vha_q_lora_rank": 12,
           "gated_attention": True, "attention_bias": True, "sliding_window": 4, "window_attn_skip_freq": 2,
           "swa_vha_q_lora_rank": 8, "add_swa_attention_sink_bias": False, "tie_word_embeddings": False, **over}
    cfg = Qwen3VHAConfig(**raw)  # the sizes, as the translation reads them (checked on its own above)
    h, t = cfg.hidden_size, {}
    for i in range(cfg.num_hidden_layers):
        dm = cfg.layer_dims(i)
        g, p = dm.num_physical_heads, f"layers.{i}."
        t[p + "self_attn.q_proj.weight"] = _rand(rng, h, g * dm.q_head_dim)
        t[p + "self_attn.q_proj.bias"] = _rand(rng, g * dm.q_head_dim)
        kv = ["shared_kv_proj"] if cfg.vha_shared_kv else ["k_proj", "v_proj"]
        for n in kv:
            t[p + f"self_attn.{n}.weight"] = _rand(rng, h, dm.num_kv_heads * dm.head_dim)
            t[p + f"self_attn.{n}.bias"] = _rand(rng, dm.num_kv_heads * dm.head_dim)
        t[p + "self_attn.q_norm.weight"] = 1 + _rand(rng, dm.head_dim)
        t[p + "self_attn.k_norm.weight"] = 1 + _rand(rng, dm.head_dim)
        t[p + "self_attn.vha_premix_weight"] = _rand(rng, dm.num_kv_heads, dm.q_head_dim, dm.head_dim, std=0.4)
        t[p + "self_attn.vha_postmix_U"] = _rand(rng, dm.num_heads, dm.postmix_rank, std=0.5)
        t[p + "self_attn.vha_postmix_V"] = _rand(rng, dm.num_heads, dm.postmix_rank, std=0.5)
        if cfg.vha_gated_attention:
            t[p + "self_attn.gate_proj.weight"] = _rand(rng, h, dm.num_heads * dm.head_dim)
        t[p + "self_attn.o_proj.weight"] = _rand(rng, dm.num_heads * dm.head_dim, h)  # no bias upstream
        if cfg.has_sinks(i):  # upstream's learnable softmax: its core attention's softmax_offset, one per head
            t[p + "self_attn.core_attention.softmax_offset"] = _rand(rng, dm.num_heads, std=1.5)
        t[p + "input_layernorm.weight"] = 1 + _rand(rng, h)
        t[p + "post_attention_layernorm.weight"] = 1 + _rand(rng, h)
        t[p + "mlp.gate_proj.weight"] = _rand(rng, h, cfg.intermediate_size)
        t[p + "mlp.up_proj.weight"] = _rand(rng, h, cfg.intermediate_size)
        t[p + "mlp.down_proj.weight"] = _rand(rng, cfg.intermediate_size, h)
    t["embedding.embed_tokens.weight"] = _rand(rng, cfg.vocab_size, h, std=1.0)
    t["norm.weight"] = 1 + _rand(rng, h)
    t["lm_head.weight"] = _rand(rng, h, cfg.vocab_size)
    _save(path, raw, t)
    return raw, t


def make_fork(path, seed=0, qkv_layout="grouped", up_gate_order="gate-up", layers=2):
    """A research-fork checkpoint (FORK_1P7B's fields at a small size): fused qkv_proj and up_gate_proj, Premix d x d,
    `layers.` / `embedding.` names, tied embeddings."""
    rng = np.random.default_rng(seed)
    raw = {**FORK_1P7B, **SMALL, "num_hidden_layers": layers, "num_attention_heads": 4, "num_key_value_heads": 2,
           "head_dim": 16, "max_window_layers": layers}
    h_p, h_kv, d, h, n_i = 4, 2, 16, SMALL["hidden_size"], SMALL["intermediate_size"]
    t = {}
    for i in range(layers):
        p = f"layers.{i}."
        q, k, v = _rand(rng, h, h_p * d), _rand(rng, h, h_kv * d), _rand(rng, h, h_kv * d)
        if qkv_layout == "grouped":  # per KV group: its h_p / h_kv query heads | K | V
            per = h_p // h_kv * d
            parts = [a for g in range(h_kv) for a in (q[:, g * per:(g + 1) * per], k[:, g * d:(g + 1) * d],
                                                      v[:, g * d:(g + 1) * d])]
        else:
            parts = [q, k, v]
        t[p + "self_attn.qkv_proj.weight"] = np.concatenate(parts, axis=1)
        t[p + "self_attn.q_norm.weight"] = 1 + _rand(rng, d)
        t[p + "self_attn.k_norm.weight"] = 1 + _rand(rng, d)
        t[p + "self_attn.vha_premix_weight"] = _rand(rng, h_kv, d, d, std=0.3)
        t[p + "self_attn.vha_postmix_U"] = _rand(rng, h_kv * h_p, 4, std=0.5)
        t[p + "self_attn.vha_postmix_V"] = _rand(rng, h_kv * h_p, 4, std=0.5)
        t[p + "self_attn.o_proj.weight"] = _rand(rng, h_kv * h_p * d, h)
        gate, up = _rand(rng, h, n_i), _rand(rng, h, n_i)
        t[p + "mlp.up_gate_proj.weight"] = np.concatenate([gate, up] if up_gate_order == "gate-up" else [up, gate], 1)
        t[p + "mlp.down_proj.weight"] = _rand(rng, n_i, h)
        t[p + "input_layernorm.weight"] = 1 + _rand(rng, h)
        t[p + "post_attention_layernorm.weight"] = 1 + _rand(rng, h)
        # the reference below reads these unfused pieces (kept out of the checkpoint)
        t[f"__ref.{i}.q"], t[f"__ref.{i}.k"], t[f"__ref.{i}.v"] = q, k, v
        t[f"__ref.{i}.gate"], t[f"__ref.{i}.up"] = gate, up
    t["embedding.embed_tokens.weight"] = _rand(rng, raw["vocab_size"], h, std=1.0)
    t["norm.weight"] = 1 + _rand(rng, h)
    _save(path, raw, {k: v for k, v in t.items() if not k.startswith("__ref")})
    return raw, t


def _save(path, raw, tensors):
    os.makedirs(path, exist_ok=True)
    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, os.path.join(path, "model.safetensors"))
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(raw, f)


def upstream_logits(ids, t, cfg, premix="btgr,krd->btkgd", fork=False):
    """Upstream's forward, float64, on the upstream tensors `t` (Paddle [in, out]); premix: its einsum string (the
    fork's is 'bthd,kde->btkhe')."""
    ids = np.asarray(ids)
    B, S = ids.shape
    eps, pos = cfg.rms_norm_eps, np.broadcast_to(np.arange(S), (B, S))
    f = {k: np.asarray(v, np.float64) for k, v in t.items()}
    x = f["embedding.embed_tokens.weight"][ids]
    for i in range(cfg.num_hidden_layers):
        dm, p = cfg.layer_dims(i), f"layers.{i}."
        g, h_kv, d, r = dm.num_physical_heads, dm.num_kv_heads, dm.head_dim, dm.q_head_dim
        hdn = oracle.rms_norm(x, f[p + "input_layernorm.weight"], eps)
        lin = lambda n, inp: inp @ f[p + n + ".weight"] + f.get(p + n + ".bias", 0.0)  # noqa: E731
        if fork:
            q, k, v = (hdn @ f[f"__ref.{i}.{n}"] for n in "qkv")
        else:
            q = lin("self_attn.q_proj", hdn)
            shared = p + "self_attn.shared_kv_proj.weight" in f
            k = lin("self_attn.shared_kv_proj" if shared else "self_attn.k_proj", hdn)
            v = None if shared else lin("self_attn.v_proj", hdn)
        qv = np.einsum(premix, q.reshape(B, S, g, r), f[p + "self_attn.vha_premix_weight"]).reshape(B, S, g * h_kv, d)
        qv = oracle.rope(oracle.rms_norm(qv, f[p + "self_attn.q_norm.weight"], eps), pos, dm.rope_theta)
        k = oracle.rope(oracle.rms_norm(k.reshape(B, S, h_kv, d), f[p + "self_attn.k_norm.weight"], eps), pos,
                        dm.rope_theta)
        v = k if v is None else v.reshape(B, S, h_kv, d)
        mask = oracle.causal_mask(pos, S, dm.window)
        sink = f.get(p + "self_attn.core_attention.softmax_offset")  # a value-less extra token per head
        y = np.empty((B, S, g * h_kv, d))
        for j in range(g * h_kv):  # head j reads KV head j // g
            s = np.einsum("bsd,btd->bst", qv[:, :, j], k[:, :, j // g]) / np.sqrt(d)
            e = np.exp(np.where(mask, -np.inf, s) - s.max(-1, keepdims=True))
            extra = 0.0 if sink is None else np.exp(sink[j] - s.max(-1, keepdims=True))
            y[:, :, j] = np.einsum("bst,btd->bsd", e / (e.sum(-1, keepdims=True) + extra), v[:, :, j // g])
        if v is k and not fork and p + "self_attn.shared_kv_proj.weight" in f:
            y = oracle.rope(y, -np.asarray(pos, np.float64), dm.rope_theta)
        m = np.eye(g * h_kv) + f[p + "self_attn.vha_postmix_V"] @ f[p + "self_attn.vha_postmix_U"].T
        y = np.einsum("hj,bsjd->bshd", m, y).reshape(B, S, -1)
        if p + "self_attn.gate_proj.weight" in f:
            y = y * oracle.sigmoid(hdn @ f[p + "self_attn.gate_proj.weight"])
        x = x + y @ f[p + "self_attn.o_proj.weight"]
        hdn = oracle.rms_norm(x, f[p + "post_attention_layernorm.weight"], eps)
        gate, up = ((hdn @ f[f"__ref.{i}.gate"], hdn @ f[f"__ref.{i}.up"]) if fork else
                    (hdn @ f[p + "mlp.gate_proj.weight"], hdn @ f[p + "mlp.up_proj.weight"]))
        x = x + oracle.silu(gate) * up @ f[p + "mlp.down_proj.weight"]
    x = oracle.rms_norm(x, f["norm.weight"], eps)
    return x @ (f["lm_head.weight"] if "lm_head.weight" in f else f["embedding.embed_tokens.weight"].T)


def run_tool(*args):
    r = subprocess.run([sys.executable, "tools/import_fleet.py", *map(str, args), "--no-progress"], capture_output=True,
                       text=True, cwd=ROOT)
    print(r.stdout[-3000:], r.stderr[-2000:])
    return r


def snapshot(path):
    return sorted((os.path.relpath(os.path.join(d, f), path), os.path.getsize(os.path.join(d, f)))
                  for d, _, fs in os.walk(path) for f in fs)


# --- import ---------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("variant", ["gated-bias-window", "shared-kv", "window-sinks"])
def test_import_paddlefleet_checkpoint(tmp_path, variant):
    """Import with the real command line and --verify; then the imported checkpoint through this project's float64
    oracle equals upstream's forward on the upstream tensors, and Qwen3VHAForCausalLM matches in float32."""
    import paddle

    from paddle_vha import Qwen3VHAForCausalLM
    from paddle_vha.families import family

    over = {"gated-bias-window": {}, "shared-kv": dict(vha_shared_kv=True, gated_attention=False),
            "window-sinks": dict(add_swa_attention_sink_bias=True)}[variant]
    raw, t = make_paddlefleet(tmp_path / "fleet", **over)
    before = snapshot(tmp_path / "fleet")
    r = run_tool(tmp_path / "fleet", tmp_path / "ours", "--verify")
    assert r.returncode == 0, r.stderr
    verify = [ln for ln in r.stdout.splitlines() if ln.startswith("verify")]
    assert verify and verify[0].endswith("-> OK")
    assert "attention_bias: upstream has no o_proj bias" in r.stdout
    assert snapshot(tmp_path / "fleet") == before, "the input is untouched"
    cfg = family("qwen3_vha").validate(str(tmp_path / "ours"))
    assert cfg.window_layers() == [1] and cfg.layer_dims(1).q_head_dim == 8 and cfg.vha_postmix_rank == 1
    if variant == "window-sinks":  # upstream's softmax_offset [H_v] is our sinks, on the window layer only
        state = load_checkpoint_numpy(tmp_path / "ours")
        assert cfg.window_attention_sinks and [n for n in state if n.endswith("sinks")] == ["model.layers.1.self_attn.sinks"]
        assert np.array_equal(state["model.layers.1.self_attn.sinks"], t["layers.1.self_attn.core_attention.softmax_offset"])
    ids = np.random.default_rng(3).integers(0, cfg.vocab_size, size=(2, 11))  # past the window (4)
    ref = upstream_logits(ids, t, cfg)
    ours, _ = oracle.causal_lm(ids, load_checkpoint_numpy(tmp_path / "ours"), config_dict(cfg))
    assert rel_err(ours, ref, f"{variant}: imported (our float64 oracle) vs upstream forward (float64)") <= 1e-10
    # --verify's reference (paddle_vha/transform/fleet_reference.py) is this test's upstream forward, in float64
    from paddle_vha.checkpoint.folder import CheckpointFolder
    from paddle_vha.transform.fleet_reference import reference_logits
    from paddle_vha.transform.import_fleet import reference_names

    src = CheckpointFolder.open(str(tmp_path / "fleet"))
    got64 = reference_logits(ids, lambda n: np.asarray(src.read(n), np.float64), reference_names(src), cfg, "paddle",
                             "grouped", "gate-up")
    assert rel_err(got64, ref, f"{variant}: fleet_reference vs the test's upstream forward (float64)") <= 1e-10
    model = Qwen3VHAForCausalLM.from_pretrained(str(tmp_path / "ours"))
    model.eval()
    got = model(paddle.to_tensor(ids), return_dict=True).logits.astype("float64").numpy()
    assert rel_err(got, ref, f"{variant}: Qwen3VHAForCausalLM float32 vs upstream forward") <= 1e-5


def test_premix_order_is_group_major_like_upstream(tmp_path):
    """Upstream's Premix einsum 'btgr,krd->btkgd' puts virtual head k*g + j (group-major); this project's order is the
    same, so the imported tensors need no head permutation. The other order ('btgr,krd->btgkd': j*H_kv + k) is a
    different function: the check can tell them apart."""
    raw, t = make_paddlefleet(tmp_path / "fleet", gated_attention=False, sliding_window=None)
    assert run_tool(tmp_path / "fleet", tmp_path / "ours").returncode == 0
    cfg = Qwen3VHAConfig(**raw)
    ids = np.random.default_rng(4).integers(0, cfg.vocab_size, size=(2, 9))
    ours, _ = oracle.causal_lm(ids, load_checkpoint_numpy(tmp_path / "ours"), config_dict(cfg))
    group_major = upstream_logits(ids, t, cfg, premix="btgr,krd->btkgd")
    head_major = upstream_logits(ids, t, cfg, premix="btgr,krd->btgkd")
    assert rel_err(ours, group_major, "ours vs upstream's order") <= 1e-10
    other = np.abs(ours - head_major).max() / np.abs(head_major).max()
    print(f"ours vs the head-major order: max rel {other:.3e}")
    assert other > 1e-2


@pytest.mark.parametrize("qkv_layout, up_gate_order", [("grouped", "gate-up"), ("concat", "up-gate")])
def test_import_fork_checkpoint_fused_and_tied(tmp_path, qkv_layout, up_gate_order):
    """The research fork: fused qkv_proj (grouped per KV group, or all-Q|K|V) and up_gate_proj, Premix d x d over
    physical num_attention_heads, tied embeddings; its Premix einsum 'bthd,kde->btkhe'. Then fold the import."""
    from paddle_vha.transform.fold import fold_checkpoint, plan_fold

    raw, t = make_fork(tmp_path / "fork", qkv_layout=qkv_layout, up_gate_order=up_gate_order)
    r = run_tool(tmp_path / "fork", tmp_path / "ours", "--qkv-layout", qkv_layout, "--up-gate-order", up_gate_order,
                 "--verify")
    assert r.returncode == 0, r.stderr
    assert "research fork" in r.stdout and any(ln.endswith("-> OK") for ln in r.stdout.splitlines())
    cfg = Qwen3VHAConfig(**raw)
    assert (cfg.num_attention_heads, cfg.vha_q_head_dim, cfg.tie_word_embeddings) == (8, 16, True)
    ids = np.random.default_rng(5).integers(0, cfg.vocab_size, size=(2, 7))
    ref = upstream_logits(ids, t, cfg, premix="bthd,kde->btkhe", fork=True)
    ours, _ = oracle.causal_lm(ids, load_checkpoint_numpy(tmp_path / "ours"), config_dict(cfg))
    assert rel_err(ours, ref, f"fork {qkv_layout}/{up_gate_order}: imported vs the fork's forward") <= 1e-10
    fold_checkpoint(plan_fold(str(tmp_path / "ours"), str(tmp_path / "gqa"), dtype="float64"), progress=False)
    folded, _ = oracle.stock_causal_lm(ids, load_checkpoint_numpy(tmp_path / "gqa"),
                                       json.load(open(tmp_path / "gqa" / "config.json")))
    assert rel_err(folded, ref, "imported, then folded, vs the fork's forward") <= 1e-10


def test_the_layout_flags_matter(tmp_path):
    """--qkv-layout states how the fused projection is laid out (--verify reads the input the same way, so it cannot
    tell a wrong statement): a grouped checkpoint imported as concat gives other K weights."""
    make_fork(tmp_path / "fork", qkv_layout="grouped")
    assert run_tool(tmp_path / "fork", tmp_path / "a", "--qkv-layout", "grouped", "--up-gate-order",
                    "gate-up").returncode == 0
    r = run_tool(tmp_path / "fork", tmp_path / "b", "--qkv-layout", "concat", "--up-gate-order", "gate-up")
    assert r.returncode == 0
    a, b = load_checkpoint_numpy(tmp_path / "a"), load_checkpoint_numpy(tmp_path / "b")
    assert not np.array_equal(a["model.layers.0.self_attn.k_proj.weight"], b["model.layers.0.self_attn.k_proj.weight"])


def test_dry_run_and_refusals(tmp_path):
    raw, t = make_paddlefleet(tmp_path / "fleet")
    before = snapshot(tmp_path)
    r = run_tool(tmp_path / "fleet", tmp_path / "out", "--dry-run")
    assert r.returncode == 0 and "dry run: nothing written" in r.stdout
    assert "transpose" in r.stdout and "sliding-window layers [1]" in r.stdout
    assert snapshot(tmp_path) == before

    def refused(folder, needle, *extra):
        b = snapshot(tmp_path)
        r = run_tool(folder, tmp_path / "out", *extra)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1 and needle in lines[0], r.stderr
        assert snapshot(tmp_path) == b, "nothing written, input untouched"

    def variant(name, change):
        tt = dict(t)
        change(tt)
        _save(tmp_path / name, raw, tt)
        return tmp_path / name

    refused(variant("missing", lambda d: d.pop("layers.2.self_attn.vha_premix_weight")),
            "missing tensors: model.layers.2.self_attn.vha_premix_weight")
    refused(variant("unknown", lambda d: d.update({"decoder.final_layernorm.weight": d["norm.weight"]})),
            "names this importer does not know: decoder.final_layernorm.weight")
    refused(variant("shape", lambda d: d.update({"layers.0.self_attn.vha_postmix_U":
                                                 d["layers.0.self_attn.vha_postmix_U"][:, :0]})),
            "mis-shaped tensors: model.layers.0.self_attn.vha_postmix_U")
    nan = dict(t)
    nan["layers.1.self_attn.o_proj.weight"] = nan["layers.1.self_attn.o_proj.weight"].copy()
    nan["layers.1.self_attn.o_proj.weight"][0, 0] = np.nan
    _save(tmp_path / "nan", raw, nan)
    refused(tmp_path / "nan", "model.layers.1.self_attn.o_proj.weight: 1 non-finite value(s)")
    _save(tmp_path / "ours-cfg", {**raw, "use_vha_attention": None}, t)
    refused(tmp_path / "ours-cfg", "neither use_vha_attention (PaddleFleet) nor attn_type 'vha'")
    _save(tmp_path / "partial", {**raw, "rotary_percent": 0.5}, t)
    refused(tmp_path / "partial", "rotary_percent=0.5: partial RoPE")
    _save(tmp_path / "nopremix", {**raw, "vha_enable_premix": False, "vha_q_lora_rank": None, "swa_vha_q_lora_rank": None},
          t)
    refused(tmp_path / "nopremix", "vha_enable_premix=false (premix-off VHA)")
    os.makedirs(tmp_path / "out")
    (tmp_path / "out" / "keep.txt").write_text("user data")
    refused(tmp_path / "fleet", "out")
    assert (tmp_path / "out" / "keep.txt").read_text() == "user data"


# --- at the width users bring ---------------------------------------------------------------------------------------

def _read_bf16(folder, name):
    """One bf16 tensor of a safetensors folder as float32, read from the raw headers (no package code)."""
    import struct

    for f in sorted(os.listdir(folder)):
        if not f.endswith(".safetensors"):
            continue
        with open(os.path.join(folder, f), "rb") as fh:
            n = struct.unpack("<Q", fh.read(8))[0]
            header = json.loads(fh.read(n))
            if name not in header:
                continue
            head = header[name]
            a, b = head["data_offsets"]
            fh.seek(8 + n + a)
            raw = np.frombuffer(fh.read(b - a), dtype="<u2")
        assert head["dtype"] == "BF16", (name, head["dtype"])
        return (raw.astype(np.uint32) << 16).view(np.float32).reshape(head["shape"])
    raise KeyError(f"{folder}: no tensor {name}")


@pytest.mark.slow
def test_import_research_fork_at_realistic_width(tmp_path):
    """The fork's Qwen3-1.7B-VHA widths (tools/fixtures/fork_shaped.py, 1 layer: vocabulary 151,936, hidden 2048 over 8
    physical heads of head_dim 128 != 2048 / 8, sharded bf16): import --verify passes, and the imported q / k / v /
    gate / up are the fork's fused tensors cut as its grouped and gate|up layouts say (bit-exact bf16 copies)."""
    from tools.fixtures.fork_shaped import make_fork_checkpoint

    raw = make_fork_checkpoint(str(tmp_path / "fork"), shape="1.7b", layers=1, tokenizer=False)
    before = snapshot(tmp_path / "fork")
    r = run_tool(tmp_path / "fork", tmp_path / "ours", "--qkv-layout", "grouped", "--up-gate-order", "gate-up",
                 "--verify", "1", "--verify-len", "8")
    assert r.returncode == 0, r.stderr
    assert [ln for ln in r.stdout.splitlines() if ln.startswith("verify")][0].endswith("-> OK")
    assert snapshot(tmp_path / "fork") == before, "the input is untouched"
    h_p, h_kv, d, inter = raw["num_attention_heads"], raw["num_key_value_heads"], raw["head_dim"], raw["intermediate_size"]
    assert raw["hidden_size"] // h_p != d, "head_dim differs from hidden / heads"
    qkv = _read_bf16(tmp_path / "fork", "layers.0.self_attn.qkv_proj.weight")  # (h, (h_p + 2 h_kv) d), [in, out]
    per = h_p // h_kv * d
    blocks = np.split(qkv, h_kv, axis=1)  # per KV group: its query heads | K | V
    want = {"q_proj": np.concatenate([b[:, :per] for b in blocks], 1), "k_proj": np.concatenate(
        [b[:, per:per + d] for b in blocks], 1), "v_proj": np.concatenate([b[:, per + d:] for b in blocks], 1)}
    up_gate = _read_bf16(tmp_path / "fork", "layers.0.mlp.up_gate_proj.weight")
    want_mlp = {"gate_proj": up_gate[:, :inter], "up_proj": up_gate[:, inter:]}
    for name, w in {**{f"self_attn.{k}": v for k, v in want.items()}, **{f"mlp.{k}": v for k, v in want_mlp.items()}}.items():
        got = _read_bf16(tmp_path / "ours", f"model.layers.0.{name}.weight")  # [out, in]
        print(f"{name}: {got.shape}, max |ours - fork slice| {np.abs(got - w.T).max():.3g}")
        assert np.array_equal(got, w.T), name


def test_import_reads_the_hf_export_sink_name(tmp_path):
    """Upstream's HF export writes a layer's softmax_offset as `self_attn.sinks` (GPT-OSS's name): read the same."""
    raw, t = make_paddlefleet(tmp_path / "fleet", add_swa_attention_sink_bias=True)
    t["layers.1.self_attn.sinks"] = t.pop("layers.1.self_attn.core_attention.softmax_offset")
    _save(tmp_path / "fleet", raw, t)
    r = run_tool(tmp_path / "fleet", tmp_path / "ours", "--verify")
    assert r.returncode == 0, r.stderr
    assert [ln for ln in r.stdout.splitlines() if ln.startswith("verify")][0].endswith("-> OK")
    state = load_checkpoint_numpy(tmp_path / "ours")
    assert np.array_equal(state["model.layers.1.self_attn.sinks"], t["layers.1.self_attn.sinks"])
