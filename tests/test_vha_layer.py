"""Qwen3VHAAttention against the float64 numpy oracle: forward, gradients, init, backends."""
import numpy as np
import paddle
import pytest
from paddleformers.transformers.qwen3.modeling import Qwen3RotaryEmbedding

import oracle
from _utils import attention_tensors, config_dict, rel_err, tiny_config, to_numpy
from paddle_vha import Qwen3VHAAttention
from paddle_vha.vha.attention import postmix

# (B, S, H_v, H_kv, d, r, gated, bias): S = 1, prime S, batch > 1, r < d, odd head counts, H_kv = 1 and 3.
GRID = [
    (2, 7, 4, 2, 16, 16, False, False),
    (1, 1, 4, 2, 16, 16, False, False),
    (3, 13, 4, 2, 16, 16, False, False),
    (2, 11, 4, 2, 16, 10, False, False),
    (2, 5, 3, 1, 16, 16, True, False),
    (2, 7, 9, 3, 8, 5, False, True),
    (2, 17, 6, 2, 16, 16, True, True),
]
IDS = [f"B{b}-S{s}-Hv{hv}-Hkv{hkv}-d{d}-r{r}{'-gated' if g else ''}{'-bias' if bi else ''}"
       for b, s, hv, hkv, d, r, g, bi in GRID]


def make_layer(B, S, h_v, h_kv, d, r, gated, bias, v_std=0.3, impl="eager"):
    cfg = tiny_config(num_attention_heads=h_v, num_key_value_heads=h_kv, head_dim=d, vha_q_head_dim=r,
                      vha_gated_attention=gated, attention_bias=bias, vha_postmix_v_init_std=v_std)
    cfg._attn_implementation = impl
    attn = Qwen3VHAAttention(cfg, 0)
    attn.eval()
    if bias:  # biases start at zero; make them count
        for name, p in attn.named_parameters():
            if name.endswith(".bias"):
                p.set_value(paddle.randn(p.shape) * 0.5)
    x = paddle.randn([B, S, cfg.hidden_size])
    return cfg, attn, x


def run_layer(cfg, attn, x):
    B, S = x.shape[:2]
    pos = paddle.arange(S, dtype="int64").expand([B, S])
    cos, sin = Qwen3RotaryEmbedding(cfg)(x, pos)
    mask = paddle.triu(paddle.full([S, S], float("-inf")), 1)[None, None]  # (1, 1, S, S) additive causal
    out, _ = attn(x, position_embeddings=(cos, sin), attention_mask=mask)
    return out


def oracle_layer(cfg, tensors, x_np):
    B, S = x_np.shape[:2]
    return oracle.vha_attention(x_np, tensors, config_dict(cfg), np.broadcast_to(np.arange(S), (B, S)))[0]


@pytest.mark.parametrize("shape", GRID, ids=IDS)
def test_layer_matches_oracle_fp32(shape):
    cfg, attn, x = make_layer(*shape)
    out = run_layer(cfg, attn, x)
    ref = oracle_layer(cfg, attention_tensors(attn), to_numpy(x))
    assert rel_err(to_numpy(out), ref, "layer fp32 vs float64 oracle") <= 1e-5


@pytest.mark.parametrize("shape", [GRID[0], GRID[3], GRID[6]], ids=[IDS[0], IDS[3], IDS[6]])
def test_layer_gradients_match_oracle_finite_differences(shape):
    """Paddle's fp32 autograd vs central differences of the float64 oracle, one random direction per tensor."""
    cfg, attn, x = make_layer(*shape)
    x.stop_gradient = False
    out = run_layer(cfg, attn, x)
    g_out = np.random.randn(*out.shape)
    (out * paddle.to_tensor(g_out, dtype="float32")).sum().backward()

    tensors = attention_tensors(attn)
    grads = {n: to_numpy(p.grad).T if n.endswith("_proj.weight") else to_numpy(p.grad)
             for n, p in attn.named_parameters()}
    tensors["__x__"], grads["__x__"] = to_numpy(x), to_numpy(x.grad)

    def loss(ts):
        ts = dict(ts)
        xx = ts.pop("__x__")
        return float((oracle_layer(cfg, ts, xx) * g_out).sum())

    eps = 1e-6
    for name in sorted(tensors):
        direction = np.random.randn(*tensors[name].shape)
        plus = {**tensors, name: tensors[name] + eps * direction}
        minus = {**tensors, name: tensors[name] - eps * direction}
        fd = (loss(plus) - loss(minus)) / (2 * eps)
        an = float((grads[name] * direction).sum())
        # scale: |<g, u>| for a random unit-variance u is about ||g||, so compare against that
        err = abs(fd - an) / max(abs(fd), np.linalg.norm(grads[name]), 1e-12)
        print(f"d/d{name}: autograd {an:+.6e}  finite-diff {fd:+.6e}  rel err {err:.2e}")
        assert err <= 2e-4, name


def test_postmix_is_identity_at_init():
    cfg = tiny_config()  # default: V = 0
    attn = Qwen3VHAAttention(cfg, 0)
    u, v = to_numpy(attn.vha_postmix_U), to_numpy(attn.vha_postmix_V)
    assert np.all(v == 0.0)
    assert 0.005 < u.std() < 0.02, u.std()  # U ~ N(0, 0.01), so the V gradient is not zero
    y = paddle.randn([2, 5, cfg.num_attention_heads, cfg.head_dim])
    assert np.array_equal(to_numpy(postmix(y, attn.vha_postmix_U, attn.vha_postmix_V)), to_numpy(y))
    # and the whole layer equals the oracle with Postmix removed (M = I)
    x = paddle.randn([2, 5, cfg.hidden_size])
    tensors = attention_tensors(attn)
    tensors["vha_postmix_U"] = tensors["vha_postmix_V"] = np.zeros_like(u)
    assert rel_err(to_numpy(run_layer(cfg, attn, x)), oracle_layer(cfg, tensors, to_numpy(x)), "init vs M=I") <= 1e-5


def test_premix_init():
    d = 32
    attn = Qwen3VHAAttention(tiny_config(head_dim=d), 0)
    w = to_numpy(attn.vha_premix_weight)  # (H_kv, d, d) = I + 0.1/sqrt(d) N(0,1)
    dev = np.linalg.norm(w - np.eye(d), axis=(1, 2))
    print("||W_g - I||_F =", dev, "expected about", 0.1 * np.sqrt(d))
    assert np.all(np.abs(dev - 0.1 * np.sqrt(d)) < 0.1 * np.sqrt(d) * 0.3)
    assert not np.allclose(w[0], w[1])  # groups start different

    r = 12
    attn = Qwen3VHAAttention(tiny_config(head_dim=d, vha_q_head_dim=r), 0)
    w = to_numpy(attn.vha_premix_weight)  # (H_kv, r, d): orthogonal rows scaled by sqrt(d / r)
    for g in range(w.shape[0]):
        np.testing.assert_allclose(w[g] @ w[g].T, (d / r) * np.eye(r), atol=1e-5)


def test_virtual_heads_are_group_major():
    """Zero every Premix group but g: only virtual heads g*H_p .. g*H_p+H_p-1 keep a non-zero query."""
    cfg = tiny_config(num_attention_heads=6, num_key_value_heads=2)
    attn = Qwen3VHAAttention(cfg, 0)
    h_p = cfg.num_physical_heads
    from paddle_vha.vha.attention import premix
    q_phys = paddle.randn([1, 3, h_p, cfg.head_dim])
    w = paddle.zeros_like(attn.vha_premix_weight)
    w[1] = attn.vha_premix_weight[1]
    q = to_numpy(premix(q_phys, w))  # (1, 3, H_v, d)
    nonzero = np.abs(q).sum(axis=(0, 1, 3)) > 0
    assert nonzero.tolist() == [False] * h_p + [True] * h_p
    np.testing.assert_allclose(q[0, :, h_p + 2], to_numpy(q_phys)[0, :, 2] @ to_numpy(w[1]), rtol=1e-5, atol=1e-6)


def test_eager_and_sdpa_backends_agree():
    cfg, attn, x = make_layer(*GRID[2], impl="eager")
    out_eager = to_numpy(run_layer(cfg, attn, x))
    cfg._attn_implementation = "sdpa"
    out_sdpa = to_numpy(run_layer(cfg, attn, x))
    ref = oracle_layer(cfg, attention_tensors(attn), to_numpy(x))
    assert rel_err(out_sdpa, ref, "sdpa vs oracle") <= 1e-5
    assert rel_err(out_sdpa, out_eager, "sdpa vs eager") <= 1e-5
