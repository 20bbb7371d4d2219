"""paddle_vha.train.square_norm: the swapped RMSNorm against float64 numpy written from the definition
(y = x / sqrt(mean(x^2) + eps) * w), forward and input / weight gradients, next to PaddleFormers' own RMSNorm's error
against the same oracle; and the swap reaches every RMSNorm of a model (Qwen3's q_norm / k_norm included)."""
import numpy as np
import pytest


def _oracle(x, w, eps, g):
    x, w, g = (np.asarray(a, np.float64) for a in (x, w, g))
    r = 1.0 / np.sqrt((x * x).mean(-1, keepdims=True) + eps)
    y = x * r * w
    gw = (g * x * r).reshape(-1, x.shape[-1]).sum(0)
    gx_hat = g * w  # d/dx of (x * r): r * gx_hat - x * r^3 * mean(gx_hat * x)
    gx = r * gx_hat - x * r ** 3 * (gx_hat * x).mean(-1, keepdims=True)
    return y, gx, gw


@pytest.mark.parametrize("shape", [(1, 1, 8), (2, 13, 48), (3, 7, 576)])
def test_square_norm_matches_float64_like_the_parent(shape):
    import paddle
    from paddleformers.nn.norm import RMSNorm
    from paddleformers.transformers import LlamaConfig

    from paddle_vha.train.square_norm import SquareRMSNorm

    rng = np.random.default_rng(sum(shape))
    x = (rng.standard_normal(shape) * 3).astype(np.float32)
    w = (1 + 0.1 * rng.standard_normal(shape[-1])).astype(np.float32)
    g = rng.standard_normal(shape).astype(np.float32)
    cfg = LlamaConfig(hidden_size=shape[-1], rms_norm_eps=1e-6)
    want = _oracle(x, w, 1e-6, g)
    errs = {}
    for cls in (RMSNorm, SquareRMSNorm):
        norm = cls(cfg)
        norm.weight.set_value(paddle.to_tensor(w))
        xt = paddle.to_tensor(x, stop_gradient=False)
        y = norm(xt)
        (y * paddle.to_tensor(g)).sum().backward()
        got = (y.numpy(), xt.grad.numpy(), norm.weight.grad.numpy())
        errs[cls.__name__] = [float(np.abs(a - b).max() / (np.abs(b).max() + 1e-30)) for a, b in zip(got, want)]
    print(errs)
    for mine, parent in zip(errs["SquareRMSNorm"], errs["RMSNorm"]):
        assert mine <= 2 * parent + 1e-6, errs


@pytest.mark.parametrize("family", ["qwen3", "llama"])
def test_every_rmsnorm_of_a_model_is_swapped(family):
    from paddleformers.nn.norm import RMSNorm
    from paddleformers.transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    from paddle_vha.train.square_norm import SquareRMSNorm, use_square_norms

    kw = dict(vocab_size=97, hidden_size=48, intermediate_size=96, num_hidden_layers=2, num_attention_heads=3,
              num_key_value_heads=1, head_dim=16)
    model = Qwen3ForCausalLM(Qwen3Config(**kw)) if family == "qwen3" else LlamaForCausalLM(LlamaConfig(**kw))
    before = sum(isinstance(m, RMSNorm) for m in model.sublayers())
    keys = sorted(model.state_dict())
    n = use_square_norms(model)
    assert n == before == (2 * 2 + 1 + (2 * 2 if family == "qwen3" else 0))
    assert all(type(m) is SquareRMSNorm for m in model.sublayers() if isinstance(m, RMSNorm))
    assert sorted(model.state_dict()) == keys
