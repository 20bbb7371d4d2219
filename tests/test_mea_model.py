"""Qwen3MEAForCausalLM: cached decode, cache bytes, save/load, refusals.

The checks every family gets (the causal LM against the float64 oracle read from the saved checkpoint, a decode step
against the oracle's own cache, generation against greedy full forwards) are in tests/test_family_models.py."""
import glob
import hashlib
import json
import os
import re

import numpy as np
import paddle
import pytest
from paddleformers.transformers import Qwen3Config, Qwen3ForCausalLM
from paddleformers.transformers.cache_utils import DynamicCache
from safetensors.numpy import load_file, save_file

from _utils import TINY, load_checkpoint_numpy, mea_tensor_shapes, read_tensor_shapes, rel_err, to_numpy
from _utils import validate_mea_checkpoint
from family_cases import CASES, randomize_mea_model
from paddle_vha.accounting import arch_from_config, kv_bytes_per_token
from paddle_vha.checkpoint.contract import CheckpointError
from paddle_vha.mea.config import Qwen3MEAConfig
from paddle_vha.mea.modeling import Qwen3MEAForCausalLM


def mea_config(**overrides):
    return Qwen3MEAConfig(**{**TINY, **overrides})


load_numpy = load_checkpoint_numpy
MODEL_GRID = CASES["qwen3_mea"].models  # the causal LM against the oracle over these: tests/test_family_models.py


def build(**overrides):
    cfg = mea_config(**overrides)
    model = Qwen3MEAForCausalLM(cfg)
    model.eval()
    randomize_mea_model(model)
    return cfg, model


@pytest.mark.parametrize("pos", ["after_hlc", "before_hlc"])
def test_cached_decode_equals_full_forward(pos):
    cfg, model = build(num_hidden_layers=3, num_attention_heads=6, num_key_value_heads=2, mea_kv_heads=6,
                       mea_layers=[1, 2], mea_stock_kv_heads=3, mea_k_norm_position=pos)
    B, P, T = 2, 7, 5
    ids = paddle.to_tensor(np.random.randint(0, cfg.vocab_size, size=(B, P + T)))
    full = to_numpy(model(ids, return_dict=True).logits)
    cache = DynamicCache(config=cfg)
    for a, b in [(0, P), (P, P + 2)] + [(t, t + 1) for t in range(P + 2, P + T)]:
        pos_ids = paddle.arange(a, b, dtype="int64").expand([B, b - a])
        out = model(ids[:, a:b], position_ids=pos_ids, past_key_values=cache, use_cache=True, return_dict=True)
        cache = out.past_key_values
        assert rel_err(to_numpy(out.logits), full[:, a:b], f"{pos}: cached tokens {a}:{b} vs full forward") <= 1e-5
    # without position_ids, positions continue from the cache length
    cache = model(ids[:, :P], use_cache=True, return_dict=True).past_key_values
    out = model(ids[:, P:], past_key_values=cache, use_cache=True, return_dict=True).logits
    assert rel_err(to_numpy(out), full[:, P:], f"{pos}: cached chunk, default positions") <= 1e-5


def _cache_bytes_per_token(cache, layer, n_tokens):
    k, v = cache.layers[layer].keys, cache.layers[layer].values
    return (k.numel().item() * k.element_size() + v.numel().item() * v.element_size()) / (k.shape[0] * n_tokens)


@pytest.mark.parametrize("n_p,n_v", [(1, 4), (2, 4), (3, 6)])
def test_cache_bytes_per_token_is_np_over_nv_of_stock(n_p, n_v):
    """An MEA layer caches n_p heads; the stock Qwen3 layer it replaces caches n_v."""
    common = {**{k: v for k, v in TINY.items() if k != "num_key_value_heads"}, "num_hidden_layers": 2, "num_attention_heads": 12}
    mea = Qwen3MEAForCausalLM(Qwen3MEAConfig(num_key_value_heads=n_p, mea_kv_heads=n_v, mea_layers=[1], **common))
    stock = Qwen3ForCausalLM(Qwen3Config(num_key_value_heads=n_v, **common))
    ids = paddle.to_tensor(np.random.randint(0, 97, size=(2, 9)))
    c_mea = mea(ids, use_cache=True, return_dict=True).past_key_values
    c_stock = stock(ids, use_cache=True, return_dict=True).past_key_values
    mea_b, stock_b = _cache_bytes_per_token(c_mea, 1, 9), _cache_bytes_per_token(c_stock, 1, 9)
    print(f"n_p={n_p} n_v={n_v}: MEA layer {mea_b:.0f} B/token, stock layer {stock_b:.0f} B/token")
    assert mea_b / stock_b == n_p / n_v
    assert mea_b == 2 * n_p * TINY["head_dim"] * 4  # K and V, fp32
    arch = arch_from_config(mea.config.to_dict())  # the cost model's bytes (paddle_vha/accounting.py)
    assert kv_bytes_per_token(arch, 4) == mea_b  # per MEA layer
    assert kv_bytes_per_token(arch, 4, all_layers=True) == mea_b + stock_b
    # the stock layer of the MEA model (mea_stock_kv_heads = n_v by default) caches what stock Qwen3 does
    assert _cache_bytes_per_token(c_mea, 0, 9) == _cache_bytes_per_token(c_stock, 0, 9)


# --- checkpoint contract ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["all-after-gn", "mixed-before-stock6", "np1-nogn-bias-tied"])
def test_saved_layout_and_round_trip(tmp_path, name):
    cfg, model = build(**MODEL_GRID[name])
    path = str(tmp_path / "ckpt")
    model.save_pretrained(path)
    assert read_tensor_shapes(path) == mea_tensor_shapes(cfg)
    assert not [f for f in os.listdir(path) if f.startswith("saved_signal")]
    raw = json.load(open(os.path.join(path, "config.json")))
    assert raw["model_type"] == "qwen3_mea" and raw["architectures"] == ["Qwen3MEAForCausalLM"]
    for key in ("mea_kv_heads", "mea_group_norm", "mea_layers", "mea_stock_kv_heads", "mea_k_norm_position"):
        assert raw[key] == getattr(cfg, key), key
    disk = load_numpy(path)
    i = cfg.mea_layer_indices[0]
    attn = model.model.layers[i].self_attn
    np.testing.assert_array_equal(disk[f"model.layers.{i}.self_attn.mea_k_lc"], to_numpy(attn.mea_k_lc))
    np.testing.assert_array_equal(disk[f"model.layers.{i}.self_attn.k_proj.weight"], to_numpy(attn.k_proj.weight).T)
    loaded = Qwen3MEAForCausalLM.from_pretrained(path)
    loaded.eval()
    ids = paddle.to_tensor(np.random.randint(0, cfg.vocab_size, size=(2, 7)))
    assert np.array_equal(to_numpy(model(ids, return_dict=True).logits), to_numpy(loaded(ids, return_dict=True).logits))


def _digest(path):
    h = hashlib.sha256()
    for f in sorted(os.listdir(path)):
        h.update(f.encode() + open(os.path.join(path, f), "rb").read())
    return h.hexdigest()


def _rewrite(path, fn):
    (shard,) = glob.glob(os.path.join(path, "*.safetensors"))
    t = load_file(shard)
    fn(t)
    save_file(t, shard)
    index = os.path.join(path, "model.safetensors.index.json")
    meta = json.load(open(index))
    meta["weight_map"] = {k: os.path.basename(shard) for k in t}
    json.dump(meta, open(index, "w"))


def _edit_config(path, **changes):
    p = os.path.join(path, "config.json")
    cfg = json.load(open(p))
    cfg.update(changes)
    json.dump(cfg, open(p, "w"))


MALFORMED = {
    "stock-qwen3": (lambda p: _edit_config(p, model_type="qwen3"), "not a Qwen3-MEA checkpoint"),
    "np>nv": (lambda p: _edit_config(p, mea_kv_heads=1), "must be <= mea_kv_heads"),
    "missing-lc": (lambda p: _rewrite(p, lambda t: t.pop("model.layers.2.self_attn.mea_v_lc")),
                   "missing tensors: model.layers.2.self_attn.mea_v_lc"),
    "lc-on-stock-layer": (lambda p: _rewrite(p, lambda t: t.update({"model.layers.1.self_attn.mea_k_lc": np.zeros((2, 3), np.float32)})),
                          "unexpected tensors: model.layers.1.self_attn.mea_k_lc"),
    "stock-layer-with-np-heads": (lambda p: _rewrite(p, lambda t: t.update(
        {"model.layers.1.self_attn.k_proj.weight": np.zeros((32, 48), np.float32)})),
        "mis-shaped tensors: model.layers.1.self_attn.k_proj.weight [32, 48] (expected [96, 48])"),
    "mea_layers-mismatch": (lambda p: _edit_config(p, mea_layers=[0, 1, 2]), "missing tensors: model.layers.1.self_attn.mea_k_lc"),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_malformed_checkpoint_is_rejected(tmp_path, case):
    break_it, needle = MALFORMED[case]
    _, model = build(**MODEL_GRID["mixed-before-stock6"])
    path = str(tmp_path / "ckpt")
    model.save_pretrained(path)
    break_it(path)
    before = _digest(path)
    with pytest.raises(CheckpointError) as e:
        validate_mea_checkpoint(path)
    msg = str(e.value)
    print(msg)
    assert needle in msg and "\n" not in msg
    with pytest.raises(CheckpointError, match="^" + re.escape(msg) + "$"):
        Qwen3MEAForCausalLM.from_pretrained(path)
    assert _digest(path) == before, "a rejected checkpoint must be left untouched"


def test_model_refuses_tensor_parallel():
    cfg = mea_config()
    cfg.tensor_model_parallel_size = 2
    with pytest.raises(ValueError, match="tensor_model_parallel_size=2"):
        Qwen3MEAForCausalLM(cfg)


def test_after_hlc_refuses_positions_that_do_not_continue_the_cache():
    """'after_hlc' re-rotates cached keys at 0..T-1: a decode step at other positions is refused, not silently wrong."""
    cfg, model = build(num_attention_heads=6, num_key_value_heads=2, mea_kv_heads=3)
    ids = paddle.to_tensor(np.random.randint(0, cfg.vocab_size, size=(2, 6)))
    cache = model(ids[:, :5], use_cache=True, return_dict=True).past_key_values
    with pytest.raises(ValueError, match=r"needs position_ids continuing the cache \(5..5 in every row\)"):
        model(ids[:, 5:], position_ids=paddle.to_tensor([[5], [3]]), past_key_values=cache, use_cache=True)
    # the same step on a 'before_hlc' model (cache holds rotated keys) is fine and matches the oracle's positions
    cfg, model = build(num_attention_heads=6, num_key_value_heads=2, mea_kv_heads=3, mea_k_norm_position="before_hlc")
    cache = model(ids[:, :5], use_cache=True, return_dict=True).past_key_values
    model(ids[:, 5:], position_ids=paddle.to_tensor([[5], [3]]), past_key_values=cache, use_cache=True)


def test_auto_classes(tmp_path):
    """AutoConfig / AutoModelForCausalLM.from_config know qwen3_mea (from_pretrained: same PaddleFormers limit as VHA)."""
    from paddleformers.transformers import AutoConfig, AutoModelForCausalLM

    cfg = mea_config(mea_kv_heads=4)
    assert type(AutoModelForCausalLM.from_config(cfg)).__name__ == "Qwen3MEAForCausalLM"
    Qwen3MEAForCausalLM(cfg).save_pretrained(tmp_path)
    loaded = AutoConfig.from_pretrained(tmp_path)
    assert isinstance(loaded, Qwen3MEAConfig) and loaded.mea_kv_heads == 4
