"""Every registered family's decoder layer, checked the same way: its spec against what it builds, its tensor-parallel
shard rules against every declared tensor, and its attention against the family's float64 oracle (forward, gradients,
backends).

How the families are found: the parametrization reads paddle_vha.families.FAMILIES when pytest collects this file, so
a family added to the registry gets every check here with no edit to this file. The structural checks need only its
registry entry (config class, model class, spec, TP plan); the oracle checks read the family's independent float64
reference and its case grid from tests/family_cases.py, and a family without them fails
`test_every_family_has_an_oracle`.
Family-specific math (Premix / Postmix algebra, HLC, head norm, the shared-KV rotation) stays in the family's own test
file (test_vha_layer.py, test_mea_layer.py, test_vha_shared_kv.py).
"""
import numpy as np
import paddle
import pytest
from paddleformers.transformers.qwen3.modeling import Qwen3RotaryEmbedding

from _utils import attention_tensors, config_dict, read_tensor_shapes, rel_err, to_numpy
from family_cases import CASES, DEFAULT_SIZES, positions
from paddle_vha.families import FAMILIES
from paddle_vha.spec.params import layer_shapes

FAMILY_IDS = sorted(m for m in FAMILIES if FAMILIES[m].has_model)  # checkpoint-level families: tests/test_moe_vha.py
LAYER_CASES = [(m, c) for m in FAMILY_IDS if m in CASES for c in CASES[m].layers]
GRADIENT_CASES = [(m, c) for m in FAMILY_IDS if m in CASES for c in CASES[m].gradient_cases]
TP_FAMILIES = [m for m in FAMILY_IDS if FAMILIES[m].tp_plan is not None]


def family_config(model_type: str, fields=None, impl: str = "eager"):
    """The family's config: DEFAULT_SIZES with `fields` over them; impl: the attention backend (None: the default)."""
    sizes = CASES[model_type].sizes if model_type in CASES else {}
    cfg = FAMILIES[model_type].config_class(**{**DEFAULT_SIZES, **sizes, **(fields or {})})
    if impl is not None:
        cfg._attn_implementation = impl
    return cfg


def attention_class(model_type: str, cfg, layer_idx: int = 0) -> type:
    """The attention class the family's model puts in layer `layer_idx` (read from a built model: the registry names
    model classes only); the random streams are reseeded after, so the layer built from it draws what it always did."""
    cls = type(FAMILIES[model_type].model_class(cfg).model.layers[layer_idx].self_attn)
    paddle.seed(1234)
    np.random.seed(1234)
    return cls


def build_layer(model_type: str, attention, fields: dict, B: int, S: int, impl: str = "eager"):
    """(cfg, layer, x): an `attention` layer 0 over the family's config with `fields`, in eval mode with its tensors
    away from their init (the family's randomize_layer), and an input x (B, S, h). The family-specific tests build
    their own shapes with it."""
    cfg = family_config(model_type, fields, impl)
    attn = attention(cfg, 0)
    attn.eval()
    CASES[model_type].randomize_layer(attn)
    return cfg, attn, paddle.randn([B, S, cfg.hidden_size])


def make_layer(model_type: str, case: str, impl: str = "eager"):
    c = CASES[model_type].layers[case]
    cfg = family_config(model_type, c.fields, impl)
    return build_layer(model_type, attention_class(model_type, cfg), c.fields, c.B, c.S, impl)


def run_layer(cfg, attn, x):
    B, S = x.shape[:2]
    pos = paddle.arange(S, dtype="int64").expand([B, S])
    cos, sin = Qwen3RotaryEmbedding(cfg)(x, pos)
    mask = paddle.triu(paddle.full([S, S], float("-inf")), 1)[None, None]  # (1, 1, S, S) additive causal
    out, _ = attn(x, position_embeddings=(cos, sin), attention_mask=mask)
    return out


def oracle_layer(model_type: str, cfg, tensors, x_np):
    B, S = x_np.shape[:2]
    return CASES[model_type].layer_oracle(x_np, tensors, config_dict(cfg), positions(B, S))


def declared_attention_tensors(model_type: str, cfg, layer_idx: int = 0) -> dict:
    """{name relative to self_attn: on-disk shape} of layer `layer_idx`'s attention, from the family's spec."""
    spec = FAMILIES[model_type].spec
    shapes = layer_shapes(spec.layer(cfg, layer_idx), cfg, layer_idx, "")
    return {n[len("self_attn."):]: s for n, s in shapes.items() if n.startswith("self_attn.")}


# --- every family: the registry entry ---------------------------------------------------------------------------------

@pytest.mark.parametrize("model_type", FAMILY_IDS)
def test_every_family_has_an_oracle(model_type):
    """A registered family is checked against an independent float64 reference, never skipped for lacking one."""
    assert model_type in CASES, f"family {model_type} has no float64 oracle and case grid in tests/family_cases.py"
    cases = CASES[model_type]
    assert set(cases.gradient_cases) <= set(cases.layers) and cases.backend_case in cases.layers


def _structural_configs(model_type: str):
    """The default sizes, and every model config of the family's grid (mixed layer kinds, tied heads, biases)."""
    fields = [dict()] + (list(CASES[model_type].models.values()) if model_type in CASES else [])
    return [family_config(model_type, f, impl=None) for f in fields]


@pytest.mark.parametrize("model_type", FAMILY_IDS)
def test_spec_is_the_built_model(model_type, tmp_path):
    """The model the family builds saves exactly the tensors its spec declares (names and on-disk shapes), and every
    layer's parameters in memory are the declared ones (Linear weights transposed: [in, out] in memory)."""
    fam = FAMILIES[model_type]
    for k, cfg in enumerate(_structural_configs(model_type)):
        model = fam.model_class(cfg)
        path = str(tmp_path / f"c{k}")
        model.save_pretrained(path)
        saved, declared = read_tensor_shapes(path), fam.tensor_shapes(cfg)
        print(f"{model_type} config {k}: {len(saved)} tensors saved, {len(declared)} declared")
        assert saved == declared, set(saved) ^ set(declared)
        for i, layer in enumerate(model.model.layers):
            prefix = fam.spec.layer_prefix(i)
            mem = {n: tuple(p.shape) for n, p in layer.named_parameters()}
            want = {n[len(prefix):]: s for n, s in declared.items() if n.startswith(prefix)}
            assert set(mem) == set(want), (i, set(mem) ^ set(want))
            for n, shape in mem.items():
                assert shape in (want[n], want[n][::-1]), (i, n, shape, want[n])


@pytest.mark.parametrize("model_type", TP_FAMILIES)
def test_tp_shard_rules_cover_every_declared_tensor(model_type):
    """For every size t the plan accepts (up to 8), every rank and layer: the plan names exactly the layer's
    parameters, and each split one divides evenly over the t ranks along its axis."""
    from paddle_vha.spec.sharding import TPPlanError

    fam = FAMILIES[model_type]
    checked = 0
    for k, cfg in enumerate(_structural_configs(model_type)):
        model = fam.model_class(cfg)
        sizes = []
        for t in (1, 2, 4, 8):
            try:
                fam.tp_plan.check(cfg, t)
            except TPPlanError:
                continue
            sizes.append(t)
            for i, layer in enumerate(model.model.layers):
                mem = {n: tuple(p.shape) for n, p in layer.named_parameters()}
                for rank in range(t):
                    plan = fam.tp_plan.layer_plan(cfg, t, rank, i)
                    assert set(plan.params) == set(mem), (t, rank, i, set(plan.params) ^ set(mem))
                    for n, shard in plan.params.items():
                        if shard.axis is not None:
                            assert mem[n][shard.axis] % t == 0, (t, rank, i, n, mem[n], shard)
                    checked += 1
        print(f"{model_type} config {k}: t in {sizes}")
        assert k > 0 or 2 in sizes, "the default sizes shard over 2 ranks"
    print(f"{model_type}: {checked} (config, t, rank, layer) plans checked")


# --- every family: the attention against its float64 oracle ----------------------------------------------------------

@pytest.mark.parametrize("model_type,case", LAYER_CASES, ids=[f"{m}-{c}" for m, c in LAYER_CASES])
def test_layer_matches_oracle_fp32(model_type, case):
    cfg, attn, x = make_layer(model_type, case)
    tensors = attention_tensors(attn)
    declared = declared_attention_tensors(model_type, cfg)
    assert {n: v.shape for n, v in tensors.items()} == declared  # the layer holds what its spec declares
    out = run_layer(cfg, attn, x)
    ref = oracle_layer(model_type, cfg, tensors, to_numpy(x))
    assert rel_err(to_numpy(out), ref, f"{model_type} layer fp32 vs float64 oracle") <= 1e-5


@pytest.mark.parametrize("model_type,case", GRADIENT_CASES, ids=[f"{m}-{c}" for m, c in GRADIENT_CASES])
def test_layer_gradients_match_oracle_finite_differences(model_type, case):
    """Paddle's fp32 autograd vs central differences of the float64 oracle, one random direction per tensor."""
    cfg, attn, x = make_layer(model_type, case)
    x.stop_gradient = False
    out = run_layer(cfg, attn, x)
    g_out = np.random.randn(*out.shape)
    (out * paddle.to_tensor(g_out, dtype="float32")).sum().backward()

    tensors = attention_tensors(attn)
    grads = {n: to_numpy(p.grad).T if n.endswith("_proj.weight") else to_numpy(p.grad)
             for n, p in attn.named_parameters()}
    must = CASES[model_type].layers[case].must_have
    assert must <= set(grads) and must <= set(tensors), must - set(grads)
    assert set(grads) == set(declared_attention_tensors(model_type, cfg))  # every declared tensor is checked
    tensors["__x__"], grads["__x__"] = to_numpy(x), to_numpy(x.grad)

    def loss(ts):
        ts = dict(ts)
        xx = ts.pop("__x__")
        return float((oracle_layer(model_type, cfg, ts, xx) * g_out).sum())

    eps = 1e-6
    for name in sorted(tensors):
        direction = np.random.randn(*tensors[name].shape)
        fd = (loss({**tensors, name: tensors[name] + eps * direction})
              - loss({**tensors, name: tensors[name] - eps * direction})) / (2 * eps)
        an = float((grads[name] * direction).sum())
        # scale: |<g, u>| for a random unit-variance u is about ||g||, so compare against that
        err = abs(fd - an) / max(abs(fd), np.linalg.norm(grads[name]), 1e-12)
        print(f"d/d{name}: autograd {an:+.6e}  finite-diff {fd:+.6e}  rel err {err:.2e}")
        assert err <= 2e-4, name


@pytest.mark.parametrize("model_type", [m for m in FAMILY_IDS if m in CASES])
def test_eager_and_sdpa_backends_agree(model_type):
    cfg, attn, x = make_layer(model_type, CASES[model_type].backend_case, impl="eager")
    out_eager = to_numpy(run_layer(cfg, attn, x))
    cfg._attn_implementation = "sdpa"
    out_sdpa = to_numpy(run_layer(cfg, attn, x))
    ref = oracle_layer(model_type, cfg, attention_tensors(attn), to_numpy(x))
    assert rel_err(out_sdpa, ref, f"{model_type} sdpa vs oracle") <= 1e-5
    assert rel_err(out_sdpa, out_eager, f"{model_type} sdpa vs eager") <= 1e-5
