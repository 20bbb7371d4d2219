"""Postmix's two forms (low-rank, dense M = I + V U^T) and its selective recompute (paddle_vha/vha/postmix_form.py).

The float64 references are written here from the equation Y' = (I + V U^T) Y and its gradients; the layer is
checked against tests/oracle.py, whose Postmix forms M explicitly (independent of either form's code)."""
import numpy as np
import paddle
import pytest

from _utils import attention_tensors, rel_err, tiny_config, to_numpy
from paddle_vha import Qwen3VHAAttention, VHAConfigError
from paddle_vha.vha import postmix_form, tp_plan
from paddle_vha.vha.attention import postmix, postmix_dense
from test_family_layers import oracle_layer, run_layer

FORMS = {"lowrank": lambda y, u, v: postmix(y, u, v), "dense": postmix_dense}


def _reference(y, u, v, g):
    """Y', dY, dU, dV of sum(g * Y') from the equations (float64 numpy), Y' = Y + V (U^T Y) along heads."""
    m = np.eye(u.shape[0]) + v @ u.T
    out = np.einsum("jk,bskd->bsjd", m, y)
    z = np.einsum("kr,bskd->bsrd", u, y)  # U^T Y
    w = np.einsum("jr,bsjd->bsrd", v, g)  # V^T g
    return out, np.einsum("kj,bskd->bsjd", m, g), np.einsum("bskd,bsrd->kr", y, w), np.einsum("bsjd,bsrd->jr", g, z)


@pytest.mark.parametrize("form", sorted(FORMS))
@pytest.mark.parametrize("h_v, rank", [(16, 4), (48, 12), (6, 1)])
def test_form_matches_the_equations_float64(form, h_v, rank):
    rng = np.random.default_rng(h_v + rank)
    y_np, g_np = rng.standard_normal((2, 5, h_v, 8)), rng.standard_normal((2, 5, h_v, 8))
    u_np, v_np = rng.standard_normal((h_v, rank)) * 0.3, rng.standard_normal((h_v, rank)) * 0.3
    y, u, v = (paddle.to_tensor(a, stop_gradient=False) for a in (y_np, u_np, v_np))
    out = FORMS[form](y, u, v)
    paddle.autograd.backward([out], [paddle.to_tensor(g_np)])
    ref = _reference(y_np, u_np, v_np, g_np)
    errs = [rel_err(to_numpy(t), r, f"{form} {name}") for t, r, name in zip((out, y.grad, u.grad, v.grad), ref,
                                                                             ("Y'", "dY", "dU", "dV"))]
    assert max(errs) <= 1e-13


@pytest.mark.parametrize("form, shape", [("lowrank", (2, 7)), ("dense", (2, 7)), ("auto", (1, 260))])
def test_layer_in_each_form_matches_the_oracle(form, shape):
    cfg = tiny_config(vha_postmix_form=form, vha_postmix_v_init_std=0.3, vha_q_head_dim=12)
    paddle.seed(1)
    attn = Qwen3VHAAttention(cfg, 0)
    x = paddle.randn([*shape, cfg.hidden_size])
    err = rel_err(to_numpy(run_layer(cfg, attn, x)), oracle_layer("qwen3_vha", cfg, attention_tensors(attn),
                                                                  to_numpy(x)), f"layer, {form} form")
    assert err <= 1e-5


def test_the_rule_and_tensor_parallel():
    n = postmix_form.DENSE_MIN_TOKENS
    assert [postmix_form.resolve("auto", t) for t in (1, n - 1, n, 8192)] == ["lowrank", "lowrank", "dense", "dense"]
    assert postmix_form.resolve("dense", 8192, tensor_parallel=True) == "lowrank"  # the R*d all-reduce survives
    assert postmix_form.resolve("lowrank", 8192) == "lowrank" and postmix_form.resolve("dense", 1) == "dense"
    with pytest.raises(tp_plan.TPPlanError, match="vha_postmix_form='dense' needs every head's output"):
        tp_plan.check(tiny_config(vha_postmix_form="dense"), 2)
    tp_plan.check(tiny_config(vha_postmix_form="auto"), 2)
    with pytest.raises(VHAConfigError, match="vha_postmix_form must be one of auto, lowrank, dense, got 'fast'"):
        tiny_config(vha_postmix_form="fast")


def _grads(cfg, x_np, seed=3):
    paddle.seed(seed)
    attn = Qwen3VHAAttention(cfg, 0)
    attn.train()
    x = paddle.to_tensor(x_np, stop_gradient=False)
    out = run_layer(cfg, attn, x)
    paddle.autograd.backward([out], [paddle.ones_like(out)])
    return attn, [to_numpy(x.grad)] + [to_numpy(p.grad) for _, p in sorted(attn.named_parameters())]


@pytest.mark.parametrize("form", ["lowrank", "dense"])
def test_recompute_gives_the_same_gradients(form):
    x_np = np.random.default_rng(0).standard_normal((2, 6, 48)).astype("float32")
    plain_cfg = tiny_config(vha_postmix_form=form, vha_postmix_v_init_std=0.3)
    rc_cfg = tiny_config(vha_postmix_form=form, vha_postmix_v_init_std=0.3)
    rc_cfg.recompute_granularity, rc_cfg.recompute_modules = "selective", ["vha_postmix"]
    _, plain = _grads(plain_cfg, x_np)
    attn, again = _grads(rc_cfg, x_np)
    assert attn.recompute_postmix and len(plain) == len(again) > 5
    worst = max(float(np.abs(a - b).max()) for a, b in zip(plain, again))
    print(f"{form}: max |grad difference| with vha_postmix recompute = {worst:.1e}")
    assert worst <= 1e-6


def _held_after_forward(cfg, x_np):
    """Bytes Paddle's host allocator holds from the end of a training forward (its counters: tensors only)."""
    from paddle.base import core

    paddle.seed(3)
    attn = Qwen3VHAAttention(cfg, 0)
    attn.train()
    x = paddle.to_tensor(x_np, stop_gradient=False)
    start = core.host_memory_stat_current_value("Allocated", 0)
    out = run_layer(cfg, attn, x)
    held = core.host_memory_stat_current_value("Allocated", 0) - start
    del out
    return held


def test_recompute_frees_the_low_rank_intermediate():
    """What recompute must save in the low-rank form is Z = U^T Y, B*S*R*d float32 values; nothing in the dense form."""
    x_np = np.random.default_rng(0).standard_normal((2, 6, 48)).astype("float32")
    saved = {}
    for form in ("lowrank", "dense"):
        cfgs = [tiny_config(vha_postmix_form=form, vha_postmix_v_init_std=0.3) for _ in range(2)]
        cfgs[1].recompute_granularity, cfgs[1].recompute_modules = "selective", ["vha_postmix"]
        saved[form] = _held_after_forward(cfgs[0], x_np) - _held_after_forward(cfgs[1], x_np)
    cfg = tiny_config()
    z_bytes = 2 * 6 * cfg.vha_postmix_rank * cfg.head_dim * 4
    print(f"held bytes saved by recompute: {saved} (Z = {z_bytes} B)")
    assert saved["lowrank"] == z_bytes and 0 <= saved["dense"] < z_bytes


def test_recompute_selection_and_refusals():
    cfg = tiny_config(num_hidden_layers=3)
    cfg.recompute_granularity, cfg.recompute_modules = "selective", ["vha_postmix"]
    assert [postmix_form.recomputes_postmix(cfg, i) for i in range(3)] == [True] * 3
    cfg.recompute_num_layers, cfg.recompute_method = 2, "first_n"
    assert [postmix_form.recomputes_postmix(cfg, i) for i in range(3)] == [True, True, False]
    cfg.recompute_modules = ["core_attn"]
    assert not postmix_form.recomputes_postmix(cfg, 0)
    for over, needle in [
        (dict(recompute_modules={"vha_postmix": 2}), "only a list selects vha_postmix"),
        (dict(recompute_granularity=None), "recompute_granularity is None"),
        (dict(recompute_method="uniform"), "needs recompute_method 'first_n' or 'block'"),
    ]:
        bad = tiny_config()
        bad.recompute_granularity, bad.recompute_modules, bad.recompute_num_layers = "selective", ["vha_postmix"], 2
        bad.recompute_method = "block"
        for k, v in over.items():
            setattr(bad, k, v)
        with pytest.raises(VHAConfigError, match=needle):
            Qwen3VHAAttention(bad, 0)
