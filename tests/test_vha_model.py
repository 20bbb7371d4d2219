"""Qwen3VHAForCausalLM against the oracle (read from the saved checkpoint), cached decode and generation."""
import glob
import os

import numpy as np
import paddle
import pytest
from paddleformers.transformers.cache_utils import DynamicCache
from safetensors.numpy import load_file

import oracle
from _utils import config_dict, rel_err, tiny_config, to_numpy
from paddle_vha import Qwen3VHAForCausalLM


def load_checkpoint_numpy(path):
    state = {}
    for f in sorted(glob.glob(os.path.join(path, "*.safetensors"))):
        state.update({k: v.astype(np.float64) for k, v in load_file(f).items()})
    return state


def randomize_postmix(model, std=0.3):
    """V starts at zero; give Postmix a real effect so tests see it."""
    for name, p in model.named_parameters():
        if name.endswith("vha_postmix_V") or name.endswith(".bias"):
            p.set_value(paddle.randn(p.shape) * std)


MODEL_GRID = {
    "base": dict(),
    "r<d-3layers": dict(vha_q_head_dim=9, num_hidden_layers=3),
    "gated-bias": dict(vha_gated_attention=True, attention_bias=True),
    "Hkv1-oddheads-tied": dict(num_attention_heads=3, num_key_value_heads=1, tie_word_embeddings=True),
}


@pytest.mark.parametrize("name", list(MODEL_GRID))
@pytest.mark.parametrize("B,S", [(1, 1), (2, 13)])
def test_model_matches_oracle_from_checkpoint(tmp_path, name, B, S):
    cfg = tiny_config(**MODEL_GRID[name])
    model = Qwen3VHAForCausalLM(cfg)
    model.eval()
    randomize_postmix(model)
    model.save_pretrained(tmp_path)
    ids = np.random.randint(0, cfg.vocab_size, size=(B, S))
    logits = model(paddle.to_tensor(ids), return_dict=True).logits
    ref, _ = oracle.causal_lm(ids, load_checkpoint_numpy(tmp_path), config_dict(cfg))
    assert rel_err(to_numpy(logits), ref, f"{name} B={B} S={S} logits vs oracle") <= 1e-5


def test_cached_decode_equals_full_forward():
    cfg = tiny_config(vha_q_head_dim=12, vha_gated_attention=True)
    model = Qwen3VHAForCausalLM(cfg)
    model.eval()
    randomize_postmix(model)
    B, P, T = 2, 7, 6  # prompt of 7, then a chunk of 2 and 4 single tokens
    ids = paddle.to_tensor(np.random.randint(0, cfg.vocab_size, size=(B, P + T)))
    full = to_numpy(model(ids, return_dict=True).logits)

    cache = DynamicCache(config=cfg)
    steps = [(0, P), (P, P + 2)] + [(t, t + 1) for t in range(P + 2, P + T)]
    for a, b in steps:
        pos = paddle.arange(a, b, dtype="int64").expand([B, b - a])
        out = model(ids[:, a:b], position_ids=pos, past_key_values=cache, use_cache=True, return_dict=True)
        cache = out.past_key_values
        assert rel_err(to_numpy(out.logits), full[:, a:b], f"cached tokens {a}:{b} vs full forward") <= 1e-5
    # the cache holds H_kv heads: that is all VHA stores per token
    k = cache.layers[0].keys
    assert list(k.shape) == [B, cfg.num_key_value_heads, P + T, cfg.head_dim], k.shape


def test_cached_decode_without_position_ids_continues_from_cache():
    """Positions default to cache length + i (stock Qwen3Model restarts them at 0)."""
    cfg = tiny_config()
    model = Qwen3VHAForCausalLM(cfg)
    model.eval()
    ids = paddle.to_tensor(np.random.randint(0, cfg.vocab_size, size=(2, 9)))
    full = to_numpy(model(ids, return_dict=True).logits)
    cache = model(ids[:, :6], use_cache=True, return_dict=True).past_key_values
    out = model(ids[:, 6:], past_key_values=cache, use_cache=True, return_dict=True).logits
    assert rel_err(to_numpy(out), full[:, 6:], "cached chunk, default positions") <= 1e-5


def test_generate_with_cache_matches_full_forwards():
    cfg = tiny_config(num_hidden_layers=3)
    model = Qwen3VHAForCausalLM(cfg)
    model.eval()
    randomize_postmix(model)
    prompt = paddle.to_tensor(np.random.randint(0, cfg.vocab_size, size=(2, 5)))
    n_new = 8
    gen, _ = model.generate(prompt, max_new_tokens=n_new, decode_strategy="greedy_search", use_cache=True)
    # greedy decode by hand with full forwards (no cache)
    seq = prompt
    for _ in range(n_new):
        logits = model(seq, return_dict=True).logits[:, -1]
        seq = paddle.concat([seq, logits.argmax(-1, keepdim=True)], axis=1)
    print("generate:", gen.numpy().tolist(), "\nfull:    ", seq[:, 5:].numpy().tolist())
    assert np.array_equal(gen.numpy(), seq[:, 5:].numpy())


def test_cached_decode_matches_oracle_cache():
    """The oracle's own cached path (past K/V) agrees with the model's cached logits."""
    cfg = tiny_config()
    model = Qwen3VHAForCausalLM(cfg)
    model.eval()
    randomize_postmix(model)
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        model.save_pretrained(d)
        state = load_checkpoint_numpy(d)
    ids = np.random.randint(0, cfg.vocab_size, size=(1, 6))
    _, past = oracle.causal_lm(ids[:, :5], state, config_dict(cfg))
    ref, _ = oracle.causal_lm(ids[:, 5:], state, config_dict(cfg), past=past)
    cache = model(paddle.to_tensor(ids[:, :5]), use_cache=True, return_dict=True).past_key_values
    out = model(paddle.to_tensor(ids[:, 5:]), position_ids=paddle.to_tensor([[5]]), past_key_values=cache,
                use_cache=True, return_dict=True).logits
    assert rel_err(to_numpy(out), ref, "decode step vs oracle with past") <= 1e-5
