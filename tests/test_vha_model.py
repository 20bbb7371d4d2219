"""Qwen3VHAForCausalLM's cached decode: in chunks and single tokens against the full forward, the cache's heads, and
positions that continue the cache by default.

The checks every family gets (the causal LM against the float64 oracle read from the saved checkpoint, a decode step
against the oracle's own cache, generation against greedy full forwards) are in tests/test_family_models.py."""
import numpy as np
import paddle
from paddleformers.transformers.cache_utils import DynamicCache

from _utils import rel_err, tiny_config, to_numpy
from family_cases import randomize_postmix
from paddle_vha import Qwen3VHAForCausalLM


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
