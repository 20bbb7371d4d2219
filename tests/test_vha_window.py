"""Sliding-window layers in Qwen3-VHA (layer_types + sliding_window, optionally with their own r, R, head counts, head
width and RoPE base, upstream's swa_* options): against the float64 oracle (tests/oracle.py, from the equations), with
prompts shorter and longer than the window, cached decode across the window edge, gradients, save / load, fold."""
import json

import numpy as np
import paddle
import pytest
from paddleformers.transformers.cache_utils import DynamicCache

import oracle
from _utils import config_dict, read_tensor_shapes, rel_err, tiny_config, to_numpy
from paddle_vha import Qwen3VHAForCausalLM, VHAConfigError
from test_vha_model import load_checkpoint_numpy, randomize_postmix

W = 4  # the window: a query sees its own position and the 3 before it
SWA = dict(sliding_window=W, use_sliding_window=True, num_hidden_layers=3,
           layer_types=["sliding_attention", "full_attention", "sliding_attention"])

VARIANTS = {
    # window layers with the full layers' sizes
    "plain": dict(),
    # their own r and R (both fold away), odd head counts (H_v 9 over 3 KV heads), r < d
    "own-r-R-odd-heads": dict(num_attention_heads=9, num_key_value_heads=3, vha_q_head_dim=12,
                              vha_window_q_head_dim=5, vha_window_postmix_rank=1),
    # their own head counts, head width and RoPE base (trainable; no stock-Qwen3 form)
    "own-heads-width-theta": dict(vha_window_num_attention_heads=6, vha_window_num_key_value_heads=3,
                                  vha_window_head_dim=8, vha_window_rope_theta=500.0),
    # with the gate and biases, and shared KV on every layer
    "gated-bias-shared-kv": dict(vha_gated_attention=True, attention_bias=True, vha_shared_kv=True),
}


def make_model(name, attn="eager", **extra):
    cfg = tiny_config(**SWA, **VARIANTS[name], **extra)
    cfg._attn_implementation = attn
    model = Qwen3VHAForCausalLM(cfg)
    model.eval()
    randomize_postmix(model)
    for n, p in model.named_parameters():
        if n.endswith("norm.weight"):  # ones at init: make them count
            p.set_value(1.0 + paddle.randn(p.shape) * 0.3)
    return cfg, model


def paddle_state(model) -> dict:
    """The model's tensors as save_pretrained writes them (Linear weights [out, in]), float64."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        model.save_pretrained(d)
        return load_checkpoint_numpy(d)


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("name", list(VARIANTS))
def test_model_matches_oracle_shorter_and_longer_than_the_window(tmp_path, name, attn):
    cfg, model = make_model(name, attn)
    model.save_pretrained(str(tmp_path))
    state, c = load_checkpoint_numpy(tmp_path), config_dict(cfg)
    for B, S in [(1, 1), (2, W - 1), (3, 13)]:  # S = 1, inside the window, a prime length well past it
        ids = np.random.randint(0, cfg.vocab_size, size=(B, S))
        got = to_numpy(model(paddle.to_tensor(ids), return_dict=True).logits)
        ref, _ = oracle.causal_lm(ids, state, c)
        assert rel_err(got, ref, f"{name} {attn} B={B} S={S}: fp32 vs float64 oracle") <= 1e-5
    # the window is real: the same tensors without it are another function
    ids = np.random.randint(0, cfg.vocab_size, size=(2, 13))
    full_c = {**c, "sliding_window": 10 ** 6}  # same layers and sizes, a window longer than the text
    ref, _ = oracle.causal_lm(ids, state, c)
    other, _ = oracle.causal_lm(ids, state, full_c)
    assert np.abs(other[:, W:] - ref[:, W:]).max() > 1e-3 * np.abs(ref).max()
    assert np.allclose(other[:, :W], ref[:, :W], rtol=0, atol=1e-12)  # identical until the window first slides


@pytest.mark.parametrize("name", list(VARIANTS))
def test_save_load_round_trip_and_on_disk_shapes(tmp_path, name):
    cfg, model = make_model(name)
    model.save_pretrained(str(tmp_path))
    raw = json.load(open(tmp_path / "config.json"))
    assert raw["layer_types"] == SWA["layer_types"] and raw["sliding_window"] == W
    shapes = read_tensor_shapes(str(tmp_path))
    for i in range(3):
        dims = cfg.layer_dims(i)
        assert (dims.window is not None) == (i != 1)
        premix = shapes[f"model.layers.{i}.self_attn.vha_premix_weight"]
        assert premix == (dims.num_kv_heads, dims.q_head_dim, dims.head_dim), (i, premix)
        assert shapes[f"model.layers.{i}.self_attn.vha_postmix_U"] == (dims.num_heads, dims.postmix_rank)
        assert shapes[f"model.layers.{i}.self_attn.q_proj.weight"] == (dims.num_physical_heads * dims.q_head_dim,
                                                                     cfg.hidden_size)
    loaded = Qwen3VHAForCausalLM.from_pretrained(str(tmp_path))
    loaded.eval()
    ids = paddle.to_tensor(np.random.randint(0, cfg.vocab_size, size=(2, 9)))
    assert np.array_equal(to_numpy(loaded(ids, return_dict=True).logits), to_numpy(model(ids, return_dict=True).logits))


@pytest.mark.parametrize("prompt", [2, 7], ids=["prompt<W", "prompt>W"])
@pytest.mark.parametrize("name", ["plain", "own-heads-width-theta", "gated-bias-shared-kv"])
def test_cached_decode_across_the_window(name, prompt):
    """A prompt, a 2-token chunk, then one token at a time past the window's edge; PaddleFormers' sliding cache layers
    keep W - 1 positions and its mask spans the whole past (paddle_vha.qwen3.modeling.attention_core keeps the mask's
    last columns)."""
    cfg, model = make_model(name)
    B, T = 2, 7
    ids = paddle.to_tensor(np.random.randint(0, cfg.vocab_size, size=(B, prompt + T)))
    full = to_numpy(model(ids, return_dict=True).logits)
    state = paddle_state(model)
    ref, _ = oracle.causal_lm(ids.numpy(), state, config_dict(cfg))
    assert rel_err(full, ref, "full forward vs oracle") <= 1e-5
    cache = DynamicCache(config=cfg)
    for a, b in [(0, prompt), (prompt, prompt + 2)] + [(t, t + 1) for t in range(prompt + 2, prompt + T)]:
        pos = paddle.arange(a, b, dtype="int64").expand([B, b - a])
        out = model(ids[:, a:b], position_ids=pos, past_key_values=cache, use_cache=True, return_dict=True)
        cache = out.past_key_values
        assert rel_err(to_numpy(out.logits), ref[:, a:b], f"{name}: cached {a}:{b} vs oracle") <= 1e-5
    kept = [int(layer.keys.shape[2]) for layer in cache.layers]
    assert kept == [W - 1, prompt + T, W - 1], kept  # the window layers hold W - 1 positions


def test_generate_past_the_window_matches_full_forwards():
    cfg, model = make_model("own-r-R-odd-heads")
    prompt = paddle.to_tensor(np.random.randint(0, cfg.vocab_size, size=(2, 5)))
    gen, _ = model.generate(prompt, max_new_tokens=8, decode_strategy="greedy_search", use_cache=True)
    seq = prompt
    for _ in range(8):
        seq = paddle.concat([seq, model(seq, return_dict=True).logits[:, -1].argmax(-1, keepdim=True)], axis=1)
    assert np.array_equal(gen.numpy(), seq[:, 5:].numpy())


@pytest.mark.parametrize("name", ["own-r-R-odd-heads", "own-heads-width-theta"])
def test_gradients_match_oracle_finite_differences(name):
    """Paddle's fp32 autograd through the whole model vs central differences of the float64 oracle, one random
    direction per tensor."""
    cfg, model = make_model(name)
    model.train()
    ids = np.random.randint(0, cfg.vocab_size, size=(2, 9))
    logits = model(paddle.to_tensor(ids), return_dict=True).logits
    g_out = np.random.randn(*logits.shape)
    (logits * paddle.to_tensor(g_out, dtype="float32")).sum().backward()
    state, c = paddle_state(model), config_dict(cfg)
    grads = {}
    for n, p in model.named_parameters():
        g = to_numpy(p.grad)
        grads[n] = g.T if n.endswith("_proj.weight") else g  # Paddle Linear: [in, out]
        assert grads[n].shape == state[n].shape, n

    def loss(s):
        return float((oracle.causal_lm(ids, s, c)[0] * g_out).sum())

    eps, worst = 1e-6, 0.0
    for n in sorted(state):
        if "self_attn" not in n:  # the attention tensors, every layer; the rest is stock Qwen3
            continue
        direction = np.random.randn(*state[n].shape)
        fd = (loss({**state, n: state[n] + eps * direction}) - loss({**state, n: state[n] - eps * direction})) / (2 * eps)
        an = float((grads[n] * direction).sum())
        err = abs(fd - an) / max(abs(fd), np.linalg.norm(grads[n]), 1e-12)
        worst = max(worst, err)
        assert err <= 2e-4, f"{n}: autograd {an:+.6e} finite-diff {fd:+.6e} rel err {err:.2e}"
    print(f"{name}: worst attention-gradient rel err {worst:.2e}")


def test_refusals():
    with pytest.raises(VHAConfigError, match="sliding_window is None"):
        tiny_config(layer_types=["sliding_attention", "full_attention"])
    with pytest.raises(VHAConfigError, match="vha_window_q_head_dim is set but no layer is a sliding-window layer"):
        tiny_config(vha_window_q_head_dim=4)
    with pytest.raises(VHAConfigError, match=r"vha_window_num_attention_heads \(virtual heads H_v=5\) must be divisible"):
        tiny_config(**SWA, vha_window_num_attention_heads=5)
    with pytest.raises(VHAConfigError, match=r"vha_window_q_head_dim \(r\) must be an int with 1 <= r <= head_dim=8"):
        tiny_config(**SWA, vha_window_head_dim=8, vha_window_q_head_dim=9)
    with pytest.raises(VHAConfigError, match="vha_window_rope_theta must be None or a positive number"):
        tiny_config(**SWA, vha_window_rope_theta=-1.0)


def test_fold_keeps_the_windows_and_refuses_own_sizes(tmp_path):
    from paddle_vha.vha.fold import FoldError, fold_checkpoint, plan_fold

    cfg, model = make_model("own-r-R-odd-heads")
    model.save_pretrained(str(tmp_path / "vha"))
    fold_checkpoint(plan_fold(str(tmp_path / "vha"), str(tmp_path / "gqa"), dtype="float64"), progress=False)
    raw = json.load(open(tmp_path / "gqa" / "config.json"))
    assert raw["model_type"] == "qwen3" and raw["layer_types"] == SWA["layer_types"] and raw["sliding_window"] == W
    assert raw["use_sliding_window"] is True and not [k for k in raw if k.startswith("vha_")]
    ids = np.random.randint(0, cfg.vocab_size, size=(2, 11))
    ref, _ = oracle.causal_lm(ids, load_checkpoint_numpy(tmp_path / "vha"), config_dict(cfg))
    got, _ = oracle.stock_causal_lm(ids, load_checkpoint_numpy(tmp_path / "gqa"), raw)
    assert rel_err(got, ref, "folded (stock GQA oracle) vs VHA oracle, windows") <= 1e-10

    cfg, model = make_model("own-heads-width-theta")
    model.save_pretrained(str(tmp_path / "own"))
    with pytest.raises(FoldError, match="sliding-window layer 0 has 6 heads over 3 KV heads of width 8 .*refusing"):
        plan_fold(str(tmp_path / "own"), str(tmp_path / "never"))
    assert not (tmp_path / "never").exists()
