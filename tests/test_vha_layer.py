"""Qwen3VHAAttention's own algebra: Postmix is the identity at init, Premix's init, virtual heads group-major.

The checks every family gets (forward and gradients against the float64 oracle over a grid of shapes, both
attention backends, the spec against the built layer) are in tests/test_family_layers.py."""
import numpy as np
import paddle

from _utils import attention_tensors, rel_err, tiny_config, to_numpy
from paddle_vha import Qwen3VHAAttention
from paddle_vha.vha.attention import postmix
from test_family_layers import oracle_layer as family_oracle_layer
from test_family_layers import run_layer


def oracle_layer(cfg, tensors, x_np):
    return family_oracle_layer("qwen3_vha", cfg, tensors, x_np)


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
