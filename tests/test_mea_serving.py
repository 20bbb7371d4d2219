"""The multi-query serving form (one wide KV head, K-side HLC in the queries, V-side after) == the direct form."""
import numpy as np
import paddle
import pytest
from paddleformers.transformers.cache_utils import DynamicCache

import mea_oracle
from _utils import TINY, config_dict, rel_err, to_numpy
from paddle_vha.mea.config import MEAConfigError, Qwen3MEAConfig
from paddle_vha.mea.modeling import Qwen3MEAForCausalLM
from paddle_vha.mea.attention import use_multiquery_form
from paddle_vha.mea.functional import query_coefficients, widen_queries
from test_mea_layer import make_layer, oracle_layer, run_layer
from test_mea_model import build, load_numpy


@pytest.mark.parametrize("shape", [
    (2, 7, 4, 2, 4, 16, "before_hlc", True, False),
    (1, 1, 6, 2, 3, 16, "before_hlc", False, True),
    (3, 13, 9, 3, 3, 8, "before_hlc", True, False),
    (2, 5, 3, 1, 3, 16, "before_hlc", False, False),
], ids=["np2-nv4", "S1-np2-nv3-bias", "prime-np3-nv3", "np1-nv3"])
def test_layer_serving_form_equals_direct_form_and_oracle(shape):
    cfg, attn, x = make_layer(*shape)
    direct = to_numpy(run_layer(cfg, attn, x))
    use_multiquery_form(attn)
    served = to_numpy(run_layer(cfg, attn, x))
    ref = oracle_layer(cfg, __import__("_utils").attention_tensors(attn), to_numpy(x))
    assert rel_err(served, direct, "multi-query form vs direct form") <= 1e-5
    assert rel_err(served, ref, "multi-query form vs float64 oracle") <= 1e-5


def test_widened_query_dot_wide_key_is_the_virtual_score():
    """[k_lc[p, j] q]_p . [K_p]_p == q . HLC(K)[j] for every head i and its virtual head j = i // G."""
    B, H, S, T, n_p, n_v, d = 2, 6, 3, 5, 2, 3, 8
    G = H // n_v
    q, k = paddle.randn([B, H, S, d]), paddle.randn([B, n_p, T, d])
    lc = paddle.randn([n_p, n_v])
    wide = to_numpy(widen_queries(q, query_coefficients(lc, G)))  # (B, H, S, n_p*d)
    k_wide = to_numpy(k).transpose(0, 2, 1, 3).reshape(B, T, n_p * d)
    got = np.einsum("bhsw,btw->bhst", wide, k_wide)
    k_v = np.einsum("bptd,pv->bvtd", to_numpy(k), to_numpy(lc))
    ref = np.einsum("bhsd,bhtd->bhst", to_numpy(q), np.repeat(k_v, G, axis=1))
    assert rel_err(got, ref, "wide scores vs virtual-head scores") <= 1e-6


def test_model_serving_form_cached_decode(tmp_path):
    """Whole model: serving form == direct form, full forward and cached decode, and == the MEA oracle."""
    cfg, model = build(num_hidden_layers=3, num_attention_heads=6, num_key_value_heads=2, mea_kv_heads=3,
                       mea_layers=[0, 2], mea_stock_kv_heads=6, mea_k_norm_position="before_hlc")
    B, P, T = 2, 6, 4
    ids = np.random.randint(0, cfg.vocab_size, size=(B, P + T))
    direct = to_numpy(model(paddle.to_tensor(ids), return_dict=True).logits)
    use_multiquery_form(model)
    served = to_numpy(model(paddle.to_tensor(ids), return_dict=True).logits)
    assert rel_err(served, direct, "model: multi-query form vs direct form") <= 1e-5
    model.save_pretrained(tmp_path)
    ref, _ = mea_oracle.causal_lm(ids, load_numpy(tmp_path), config_dict(cfg))
    assert rel_err(served, ref, "model: multi-query form vs oracle") <= 1e-5
    cache = DynamicCache(config=cfg)
    t_ids = paddle.to_tensor(ids)
    for a, b in [(0, P)] + [(t, t + 1) for t in range(P, P + T)]:
        pos = paddle.arange(a, b, dtype="int64").expand([B, b - a])
        out = model(t_ids[:, a:b], position_ids=pos, past_key_values=cache, use_cache=True, return_dict=True)
        cache = out.past_key_values
        assert rel_err(to_numpy(out.logits), direct[:, a:b], f"serving form, cached {a}:{b}") <= 1e-5
    assert list(cache.layers[0].keys.shape) == [B, 2, P + T, cfg.head_dim]  # n_p physical heads cached


def test_serving_form_refuses_after_hlc_models():
    model = Qwen3MEAForCausalLM(Qwen3MEAConfig(**{**TINY, "mea_kv_heads": 4}))  # default after_hlc
    with pytest.raises(MEAConfigError, match="needs mea_k_norm_position='before_hlc'.*MEA layers \\[0, 1\\]"):
        use_multiquery_form(model)
