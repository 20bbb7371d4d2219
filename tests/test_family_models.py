"""Every registered family's causal LM, checked the same way against its float64 oracle read from the saved checkpoint:
the full forward, one cached decode step against the oracle's own cache, and generation with the cache against greedy
full forwards.

Families are read from paddle_vha.families.FAMILIES at collection time, with their oracle and configs from
tests/family_cases.py (tests/test_family_layers.py checks that every registered family has them). Cached decode
in chunks, the cache's contents and the family's own options stay in the family's test file (test_vha_model.py,
test_mea_model.py, test_vha_shared_kv.py, test_vha_window.py).
"""
import numpy as np
import paddle
import pytest

from _utils import config_dict, load_checkpoint_numpy, rel_err, to_numpy
from family_cases import CASES
from test_family_layers import FAMILY_IDS, family_config

ORACLE_FAMILIES = [m for m in FAMILY_IDS if m in CASES]
MODEL_CASES = [(m, c) for m in ORACLE_FAMILIES for c in CASES[m].models]


def build(model_type: str, fields):
    from paddle_vha.families import FAMILIES

    cfg = family_config(model_type, fields, impl=None)  # the default attention backend, as a user gets
    model = FAMILIES[model_type].model_class(cfg)
    model.eval()
    CASES[model_type].randomize_model(model)
    return cfg, model


@pytest.mark.parametrize("B,S", [(1, 1), (2, 13)])
@pytest.mark.parametrize("model_type,name", MODEL_CASES, ids=[f"{m}-{c}" for m, c in MODEL_CASES])
def test_model_matches_oracle_from_checkpoint(tmp_path, model_type, name, B, S):
    cfg, model = build(model_type, CASES[model_type].models[name])
    model.save_pretrained(tmp_path)
    ids = np.random.randint(0, cfg.vocab_size, size=(B, S))
    logits = model(paddle.to_tensor(ids), return_dict=True).logits
    ref, _ = CASES[model_type].lm_oracle(ids, load_checkpoint_numpy(tmp_path), config_dict(cfg))
    assert rel_err(to_numpy(logits), ref, f"{model_type} {name} B={B} S={S} logits vs oracle") <= 1e-5


@pytest.mark.parametrize("model_type", ORACLE_FAMILIES)
def test_cached_decode_matches_oracle_cache(tmp_path, model_type):
    """The oracle's own cached path (past K/V) agrees with the model's cached logits."""
    cfg, model = build(model_type, CASES[model_type].decode_fields)
    model.save_pretrained(tmp_path)
    state = load_checkpoint_numpy(tmp_path)
    lm = CASES[model_type].lm_oracle
    ids = np.random.randint(0, cfg.vocab_size, size=(1, 6))
    _, past = lm(ids[:, :5], state, config_dict(cfg))
    ref, _ = lm(ids[:, 5:], state, config_dict(cfg), past=past)
    cache = model(paddle.to_tensor(ids[:, :5]), use_cache=True, return_dict=True).past_key_values
    out = model(paddle.to_tensor(ids[:, 5:]), position_ids=paddle.to_tensor([[5]]), past_key_values=cache,
                use_cache=True, return_dict=True).logits
    assert rel_err(to_numpy(out), ref, f"{model_type} decode step vs oracle with past") <= 1e-5


@pytest.mark.parametrize("model_type", ORACLE_FAMILIES)
def test_generate_with_cache_matches_full_forwards(model_type):
    cfg, model = build(model_type, CASES[model_type].generate_fields)
    prompt = paddle.to_tensor(np.random.randint(0, cfg.vocab_size, size=(2, 5)))
    n_new = CASES[model_type].generate_tokens
    gen, _ = model.generate(prompt, max_new_tokens=n_new, decode_strategy="greedy_search", use_cache=True)
    seq = prompt  # greedy decode by hand with full forwards (no cache)
    for _ in range(n_new):
        logits = model(seq, return_dict=True).logits[:, -1]
        seq = paddle.concat([seq, logits.argmax(-1, keepdim=True)], axis=1)
    print(f"{model_type} generate:", gen.numpy().tolist(), "\nfull:    ", seq[:, 5:].numpy().tolist())
    assert np.array_equal(gen.numpy(), seq[:, 5:].numpy())
