"""Tensors declared once (paddle_vha/spec/) and the model factory (paddle_vha/modeling/): the shape a variant takes.

A demonstration variant, not shipped: Qwen3 with a learned per-head output scale (`self_attn.head_scale`, one number
per query head, applied to the attention output before o_proj). Everything it needs is in this file:

    its spec      one Param added to the stock layer's (HEAD_SCALE below), its initializer and fold role included
    its math      HeadScaleAttention.forward (the only code with equations; __init__ builds what the spec declares)
                  and its fold rule (the scale absorbed into o_proj's input columns, float64)
    its config    a Qwen3Config subclass naming its model_type
    its fold form one object: it folds into stock Qwen3 (paddle_vha.spec.fold.FoldForm as it is)
    the registry  one line: FAMILIES[model_type] = Family(...)

and nothing in paddle_vha/ changes: the contract, the checkpoint validation, the flex-checkpoint name rules, the
tensor-parallel shards, the model classes and the fold (plan, table, write, --verify) all come from the spec, the
factory and the transform pipeline (checked below, including that no package file spells the new tensor's name).
"""
import os
import pathlib

import numpy as np
import paddle
import pytest
from paddle import nn
from paddleformers.transformers import Qwen3Config, Qwen3ForCausalLM
from paddleformers.transformers.qwen3 import modeling as pf_qwen3
from paddleformers.transformers.qwen3.modeling import Qwen3Attention, apply_rotary_pos_emb

from paddle_vha.checkpoint import CheckpointError
from paddle_vha.families import FAMILIES, Family, family_of
from paddle_vha.modeling.factory import Variant, build_family
from paddle_vha.modeling.parameters import build_declared
from paddle_vha.qwen3.base import QWEN3_BASE
from paddle_vha.qwen3.modeling import attention_core
from paddle_vha.qwen3.spec import QWEN3, QWEN3_LAYER, TOP, top_sizes
from paddle_vha.qwen3.tp_plan import GQAPlan
from paddle_vha.spec.fold import FoldForm, FoldRule
from paddle_vha.spec.params import ModelSpec, Param, TensorShard

ROOT = pathlib.Path(__file__).resolve().parents[1]
SIZES = dict(vocab_size=97, hidden_size=48, intermediate_size=80, num_hidden_layers=2, num_attention_heads=6,
             num_key_value_heads=2, head_dim=10, tie_word_embeddings=False)


# --- the demonstration variant: spec, math, config, registry line ---------------------------------------------------

def fold_head_scale(w_o, scale):
    """[h, H*d] o_proj and the [H] scale -> [h, H*d]: input block j of o_proj times s_j (float64)."""
    w = np.asarray(w_o, np.float64)
    return w * np.repeat(np.asarray(scale, np.float64), w.shape[1] // scale.shape[0])[None, :]  # (h, H*d)


HEAD_SCALE_LAYER = QWEN3_LAYER.replace("qwen3_head_scale_demo", add=[Param(
    "self_attn.head_scale", lambda s: (s.heads,), TensorShard(0),  # split by query head, as q_proj
    init=lambda s, cfg: nn.initializer.Constant(1.0),
    fold=FoldRule("self_attn.o_proj", "fold head scale", {"weight": fold_head_scale}))])
HEAD_SCALE = ModelSpec(top=TOP, top_sizes=top_sizes, layer=lambda cfg, i: HEAD_SCALE_LAYER)


class HeadScaleConfig(Qwen3Config):
    model_type = "qwen3_head_scale_demo"


DEMO_FOLD = FoldForm(Qwen3Config.model_type)  # what its checkpoints fold into: stock Qwen3


class HeadScaleAttention(Qwen3Attention):
    """Qwen3 attention; the output of head j is multiplied by head_scale[j] before o_proj."""

    def __init__(self, config, layer_idx=0):
        super().__init__(config, layer_idx)
        build_declared(self, HEAD_SCALE_LAYER, config, layer_idx, "self_attn.")  # the tensors the spec declares

    def forward(self, hidden_states, position_embeddings=None, attention_mask=None, past_key_values=None,
                use_cache=False, attn_mask_startend_row_indices=None, batch_size=None, **kwargs):
        d, h, h_kv = self.head_dim, self.num_heads, self.num_key_value_heads
        q = self.q_norm(self.q_proj(hidden_states).reshape([0, 0, h, d])).transpose([0, 2, 1, 3])  # (B, H, S, d)
        k = self.k_norm(self.k_proj(hidden_states).reshape([0, 0, h_kv, d])).transpose([0, 2, 1, 3])  # (B, H_kv, S, d)
        v = self.v_proj(hidden_states).reshape([0, 0, h_kv, d]).transpose([0, 2, 1, 3])  # (B, H_kv, S, d)
        q, k = apply_rotary_pos_emb(q, k, *position_embeddings)
        if past_key_values is not None:
            k, v = past_key_values.update(k, v, self.layer_idx)
        y, weights = attention_core(self, q, k, v, attention_mask, attn_mask_startend_row_indices)  # (B, S, H*d)
        y = y.reshape([0, 0, h, d]) * self.head_scale.reshape([1, 1, h, 1])  # (B, S, H, d)
        return self.o_proj(y.flatten(2)), weights


@pytest.fixture(scope="module")
def demo():
    classes = build_family(QWEN3_BASE, Variant(
        prefix="Qwen3HeadScaleDemo", label="Qwen3 head-scale (demo)", config_class=HeadScaleConfig, spec=HEAD_SCALE,
        module=__name__, attention=lambda config, layer_idx: HeadScaleAttention))
    entry = Family(model_type=HeadScaleConfig.model_type, label="Qwen3 head-scale (demo)",  # the registry line
                   config_ref=f"{__name__}:HeadScaleConfig", model_ref=f"{__name__}:DEMO_CAUSAL_LM",
                   spec=HEAD_SCALE, tp_plan=GQAPlan(HEAD_SCALE), fold_ref=f"{__name__}:DEMO_FOLD")
    globals()["DEMO_CAUSAL_LM"] = classes.causal_lm
    FAMILIES[entry.model_type] = entry
    yield classes
    del FAMILIES[entry.model_type]


def _inputs(seed=3, batch=2, seq=7):
    return paddle.to_tensor(np.random.default_rng(seed).integers(0, SIZES["vocab_size"], (batch, seq)), dtype="int64")


@pytest.fixture
def float64():
    paddle.set_default_dtype("float64")
    yield
    paddle.set_default_dtype("float32")


def test_demo_variant_math(demo, float64):
    """The factory's classes run the variant's attention in every layer (checked against stock Qwen3 in float64)."""
    paddle.seed(0)
    cfg = HeadScaleConfig(**SIZES)
    model = demo.causal_lm(cfg)
    assert isinstance(model.model.layers[0].self_attn, HeadScaleAttention)
    assert [type(m).__name__ for m in (model, model.model, model.model.layers[0])] == [
        "Qwen3HeadScaleDemoForCausalLM", "Qwen3HeadScaleDemoModel", "Qwen3HeadScaleDemoDecoderLayer"]

    # the math: head_scale = 1 is stock Qwen3 with the same weights; a scale s_j equals o_proj's input block j times s_j
    stock = Qwen3ForCausalLM(Qwen3Config(**SIZES))
    state = {k: v for k, v in model.state_dict().items() if not k.endswith("head_scale")}
    stock.set_state_dict(state)
    x = _inputs()
    with paddle.no_grad():
        got, ref = model(x, return_dict=True).logits.numpy(), stock(x, return_dict=True).logits.numpy()
    print(f"head_scale = 1 vs stock Qwen3: max |diff| {np.abs(got - ref).max():.2e}")
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-12)
    scale = np.random.default_rng(1).uniform(0.5, 1.5, (2, SIZES["num_attention_heads"]))
    d = SIZES["head_dim"]
    for i, layer in enumerate(model.model.layers):
        layer.self_attn.head_scale.set_value(paddle.to_tensor(scale[i]))
        w = state[f"model.layers.{i}.self_attn.o_proj.weight"].numpy()  # [in = H*d, out] in memory
        stock.model.layers[i].self_attn.o_proj.weight.set_value(paddle.to_tensor(w * np.repeat(scale[i], d)[:, None]))
    with paddle.no_grad():
        got, ref = model(x, return_dict=True).logits.numpy(), stock(x, return_dict=True).logits.numpy()
    print(f"head_scale s vs stock with o_proj scaled by s: max |diff| {np.abs(got - ref).max():.2e}")
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-12)  # float64: only the order of a product differs



def test_demo_variant_contract_registry_and_plan(demo, tmp_path):
    """Its contract, checkpoint validation and tensor-parallel plan come from the spec and the registry line."""
    paddle.seed(0)
    cfg = HeadScaleConfig(**SIZES)
    model, stock = demo.causal_lm(cfg), Qwen3ForCausalLM(Qwen3Config(**SIZES))
    scale = np.random.default_rng(1).uniform(0.5, 1.5, SIZES["num_attention_heads"]).astype("float32")
    model.model.layers[1].self_attn.head_scale.set_value(paddle.to_tensor(scale))

    # the contract, derived from the spec: save -> the registry validates; a missing tensor is named
    out = str(tmp_path / "demo")
    model.save_pretrained(out)
    fam = family_of(out)
    assert fam.model_type == HeadScaleConfig.model_type
    assert fam.tensor_shapes(cfg)["model.layers.1.self_attn.head_scale"] == (SIZES["num_attention_heads"],)
    fam.validate(out)
    loaded = demo.causal_lm.from_pretrained(out)
    np.testing.assert_array_equal(loaded.model.layers[1].self_attn.head_scale.numpy(), scale)
    stock_folder = str(tmp_path / "stock")
    stock.save_pretrained(stock_folder)  # no head_scale: refused as this family, by name
    with open(os.path.join(stock_folder, "config.json")) as f:
        text = f.read().replace('"model_type": "qwen3"', f'"model_type": "{HeadScaleConfig.model_type}"')
    with open(os.path.join(stock_folder, "config.json"), "w") as f:
        f.write(text)
    with pytest.raises(CheckpointError, match="head_scale"):
        family_of(stock_folder).validate(stock_folder)

    # tensor parallelism: the new tensor is split with the query heads on every rank; all else as stock Qwen3
    plan = fam.tp_plan.layer_plan(cfg, 2, 1, 0)
    assert plan.params["self_attn.head_scale"] == TensorShard(0)
    assert {k: v for k, v in plan.params.items() if k != "self_attn.head_scale"} == GQAPlan(QWEN3).layer_plan(
        cfg, 2, 1, 0).params

    # nothing in the installed package names the demo's tensor: the variant touched no package file
    spelled = [str(p.relative_to(ROOT)) for p in (ROOT / "paddle_vha").rglob("*.py") if "head_scale" in p.read_text()]
    assert spelled == [], spelled


def test_demo_variant_folds_through_the_generic_pipeline(demo, tmp_path):
    """The fold pipeline (paddle_vha/transform/fold.py) folds the demo into stock Qwen3 from its spec's fold role and
    its registry line alone: the folded o_proj is the rule's product (float64, exact), the plan's table names the
    step and the absorbed tensor, and --verify's comparison (the demo model vs PaddleFormers' stock Qwen3 loading the
    folded folder) agrees to float32 rounding."""
    from paddle_vha.checkpoint.safetensors_io import read_header, read_tensor
    from paddle_vha.transform.describe import format_plan
    from paddle_vha.transform.fold import fold_checkpoint, plan_fold, verify_fold

    paddle.seed(0)
    cfg = HeadScaleConfig(**SIZES)
    model = demo.causal_lm(cfg)
    scale = np.random.default_rng(2).uniform(0.5, 1.5, (2, SIZES["num_attention_heads"])).astype("float32")
    for i, layer in enumerate(model.model.layers):
        layer.self_attn.head_scale.set_value(paddle.to_tensor(scale[i]))
    src, out = str(tmp_path / "demo"), str(tmp_path / "folded")
    model.save_pretrained(src)
    plan = plan_fold(src, out, dtype="float64")
    text = format_plan(plan)
    print(text)
    rows = [ln.split() for ln in text.splitlines() if "self_attn.o_proj.weight" in ln or "self_attn.head_scale" in ln]
    assert [r[2:4] for r in rows] == [["fold", "head"], ["absorbed", "[6]"]], rows
    assert plan.out_config["model_type"] == "qwen3" and plan.out_config["architectures"] == ["Qwen3ForCausalLM"]
    fold_checkpoint(plan, progress=False)

    def tensors(folder):
        found = {}
        for f in sorted(os.listdir(folder)):
            if f.endswith(".safetensors"):
                refs = read_header(os.path.join(folder, f))[1]
                found.update({n: read_tensor(r).astype(np.float64) for n, r in refs.items()})
        return found

    before, after = tensors(src), tensors(out)
    assert set(after) == set(before) - {f"model.layers.{i}.self_attn.head_scale" for i in range(2)}
    for i in range(2):
        n = f"model.layers.{i}.self_attn.o_proj.weight"
        want = before[n] * np.repeat(scale[i].astype(np.float64), SIZES["head_dim"])[None, :]
        print(f"layer {i} folded o_proj vs W_O diag(s): max |diff| {np.abs(after[n] - want).max():.1e}")
        np.testing.assert_array_equal(after[n], want)
    assert all(np.array_equal(after[n], before[n]) for n in after if "o_proj.weight" not in n)
    assert family_of(out).model_type == "qwen3"
    errors = verify_fold(src, out)
    print(f"demo vs folded stock Qwen3 (Paddle fp32): {errors}")
    assert errors["max_rel"] <= 1e-5


def test_factory_adds_nothing_to_the_base(demo):
    """A family built over the base with the base's own attention is PaddleFormers' Qwen3ForCausalLM, parameter for
    parameter, under the same seed: the factory's constructors are the parent's (no copied body to drift)."""
    plain = build_family(QWEN3_BASE, Variant(prefix="Qwen3PlainFactoryCheck", label="Qwen3 (factory check)",
                                             config_class=HeadScaleConfig, spec=QWEN3, module=__name__,
                                             attention=lambda config, layer_idx: Qwen3Attention))
    paddle.seed(7)
    ours = plain.causal_lm(HeadScaleConfig(**SIZES)).state_dict()
    paddle.seed(7)
    theirs = Qwen3ForCausalLM(Qwen3Config(**SIZES)).state_dict()
    assert list(ours) == list(theirs)
    for name in theirs:
        np.testing.assert_array_equal(ours[name].numpy(), theirs[name].numpy(), err_msg=name)


class _FailingAttention(Qwen3Attention):
    def __init__(self, config, layer_idx=0):
        raise RuntimeError("attention construction failed")


def test_slots_are_restored_after_construction(demo):
    names = QWEN3_BASE.classes
    before = {role: getattr(pf_qwen3, name) for role, name in names.items()}
    demo.causal_lm(HeadScaleConfig(**SIZES))
    assert {role: getattr(pf_qwen3, name) for role, name in names.items()} == before
    broken = build_family(QWEN3_BASE, Variant(prefix="Qwen3FailingFactoryCheck", label="Qwen3 (failing check)",
                                              config_class=HeadScaleConfig, spec=QWEN3, module=__name__,
                                              attention=lambda config, layer_idx: _FailingAttention))
    with pytest.raises(RuntimeError, match="attention construction failed"):
        broken.causal_lm(HeadScaleConfig(**SIZES))  # fails three slots deep
    assert {role: getattr(pf_qwen3, name) for role, name in names.items()} == before
    paddle.seed(0)
    Qwen3ForCausalLM(Qwen3Config(**SIZES))  # PaddleFormers' own classes build stock layers again
