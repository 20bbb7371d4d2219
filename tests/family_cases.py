"""Per-family test data for the shared layer and model tests (tests/test_family_layers.py, tests/test_family_models.py).

The shared tests parametrize over the family registry, paddle_vha.families.FAMILIES, read at collection time: every
registered family gets the structural checks (its spec against the layer it builds, its tensor-parallel shard rules
against every declared tensor) from its registry entry alone, with `DEFAULT_SIZES` as its config. What cannot come from
the registry is an independent reference, so each family also names here its float64 oracle (tests/oracle.py,
tests/mea_oracle.py: written from the equations, importing nothing from paddle_vha), the configs its oracle checks run
on, and how to move its tensors away from their initial values so every tensor counts. A family registered without an
entry here fails `test_every_family_has_an_oracle` (it is not skipped).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, FrozenSet, List, Tuple

import numpy as np

import mea_oracle
import oracle
from _utils import TINY

DEFAULT_SIZES = TINY  # the config every registered family is built from for the structural checks


@dataclass(frozen=True)
class LayerCase:
    """One attention-layer case: batch B, length S, config fields over TINY, tensors its gradients must include."""

    B: int
    S: int
    fields: Dict
    must_have: FrozenSet[str] = frozenset()


@dataclass(frozen=True)
class FamilyCases:
    layer_oracle: Callable  # (x (B, S, h), tensors, config dict, positions (B, S)) -> out (B, S, h), float64
    lm_oracle: Callable  # (ids, on-disk state, config dict, past=None) -> (logits, cache), float64
    layers: Dict[str, LayerCase]  # id -> case: forward vs the oracle in fp32
    gradient_cases: Tuple[str, ...]  # ids of `layers` whose gradients are checked by finite differences
    backend_case: str  # id of `layers` run with both the eager and the sdpa attention backends
    randomize_layer: Callable  # (attention layer) -> None: biases, mixing and norm tensors away from init
    models: Dict[str, Dict] = field(default_factory=dict)  # id -> config fields: the causal LM vs the oracle
    randomize_model: Callable = lambda model: None  # (causal LM) -> None
    decode_fields: Dict = field(default_factory=dict)  # the config of the cached-decode checks
    generate_fields: Dict = field(default_factory=dict)  # the config of the generate check
    generate_tokens: int = 8
    sizes: Dict = field(default_factory=dict)  # fields over DEFAULT_SIZES for every config of the family


def _grid(rows: List[Tuple], fields: Callable, name: Callable, must_have=frozenset()) -> Dict[str, LayerCase]:
    return {name(*r): LayerCase(r[0], r[1], fields(*r[2:]), must_have) for r in rows}


# --- Qwen3-VHA (and its shared-KV option) -------------------------------------------------------------------------

# (B, S, H_v, H_kv, d, r, gated, bias): S = 1, prime S, batch > 1, r < d, odd head counts, H_kv = 1 and 3.
VHA_GRID = [
    (2, 7, 4, 2, 16, 16, False, False),
    (1, 1, 4, 2, 16, 16, False, False),
    (3, 13, 4, 2, 16, 16, False, False),
    (2, 11, 4, 2, 16, 10, False, False),
    (2, 5, 3, 1, 16, 16, True, False),
    (2, 7, 9, 3, 8, 5, False, True),
    (2, 17, 6, 2, 16, 16, True, True),
]
SHARED_KV_GRID = [  # the same axes, with vha_shared_kv (one projection is both keys and values), composed prologue
    (2, 7, 4, 2, 16, 16, False, False),
    (1, 1, 4, 2, 16, 16, False, False),
    (3, 13, 4, 2, 16, 10, False, True),
    (2, 5, 3, 1, 16, 16, True, False),
    (2, 7, 9, 3, 8, 5, True, True),
]


PREMIX_OFF_GRID = [  # vha_premix false (the fork's kv_postmix_only): q_proj's H_v heads of width d, Postmix only
    (2, 7, 4, 2, 16, 16, False, False),
    (1, 1, 6, 3, 8, 8, False, True),
    (2, 9, 8, 2, 16, 16, True, False),
    (2, 5, 3, 3, 8, 8, False, False),
]


def _vha_name(prefix):
    return lambda b, s, hv, hkv, d, r, g, bi: (f"{prefix}B{b}-S{s}-Hv{hv}-Hkv{hkv}-d{d}-r{r}{'-gated' if g else ''}"
                                               f"{'-bias' if bi else ''}")


def _vha_fields(shared, premix=True):
    return lambda hv, hkv, d, r, g, bi: dict(num_attention_heads=hv, num_key_value_heads=hkv, head_dim=d,
                                             vha_q_head_dim=r, vha_gated_attention=g, attention_bias=bi,
                                             vha_postmix_v_init_std=0.3,
                                             **(dict(vha_shared_kv=True, vha_fused_prologue=False) if shared else {}),
                                             **({} if premix else dict(vha_premix=False)))


def randomize_biases(attn):
    """Biases start at zero; make them count."""
    import paddle

    for name, p in attn.named_parameters():
        if name.endswith(".bias"):
            p.set_value(paddle.randn(p.shape) * 0.5)


def randomize_postmix(model, std=0.3):
    """V starts at zero; give Postmix a real effect so tests see it (and the biases)."""
    import paddle

    for name, p in model.named_parameters():
        if name.endswith("vha_postmix_V") or name.endswith(".bias"):
            p.set_value(paddle.randn(p.shape) * std)


def _vha_layer(x, tensors, cfg, positions):
    return oracle.vha_attention(x, tensors, cfg, positions)[0]


_vha_layers = {**_grid(VHA_GRID, _vha_fields(False), _vha_name("")),
               **_grid(SHARED_KV_GRID, _vha_fields(True), _vha_name("skv-"), frozenset({"shared_kv_proj.weight"})),
               **_grid(PREMIX_OFF_GRID, _vha_fields(False, premix=False), _vha_name("nopremix-"))}
_vha_ids = list(_vha_layers)

VHA = FamilyCases(
    layer_oracle=_vha_layer,
    lm_oracle=oracle.causal_lm,
    layers=_vha_layers,
    gradient_cases=(_vha_ids[0], _vha_ids[3], _vha_ids[6], _vha_ids[7], _vha_ids[10], _vha_ids[11], _vha_ids[12]),
    backend_case=_vha_ids[2],
    randomize_layer=randomize_biases,
    models={
        "base": dict(),
        "r<d-3layers": dict(vha_q_head_dim=9, num_hidden_layers=3),
        "gated-bias": dict(vha_gated_attention=True, attention_bias=True),
        "Hkv1-oddheads-tied": dict(num_attention_heads=3, num_key_value_heads=1, tie_word_embeddings=True),
        "nopremix": dict(vha_premix=False),
    },
    randomize_model=randomize_postmix,
    decode_fields=dict(),
    generate_fields=dict(num_hidden_layers=3),
)


# --- Qwen3-MEA -----------------------------------------------------------------------------------------------------

# (B, S, H, n_p, n_v, d, k_norm position, group norm, bias): S = 1, prime S, B > 1, odd head counts,
# n_p = 1, n_p = n_v, n_v = H (MHA-like), and both k_norm placements.
MEA_GRID = [
    (2, 7, 4, 2, 4, 16, "after_hlc", True, False),
    (1, 1, 4, 1, 2, 16, "after_hlc", False, False),
    (3, 13, 6, 2, 3, 16, "before_hlc", True, False),
    (2, 11, 9, 3, 3, 8, "after_hlc", True, True),
    (2, 5, 3, 1, 3, 16, "before_hlc", False, True),
    (2, 17, 10, 3, 5, 8, "after_hlc", False, False),
    (1, 1, 6, 2, 6, 16, "before_hlc", True, False),
]


def randomize_mea_layer(attn):
    """Every tensor counts: random HLC, norm weights, biases."""
    import paddle

    for name, p in attn.named_parameters():
        if name.endswith(".bias") or name.startswith("mea_") or name.endswith("norm.weight"):
            base = 1.0 if name.endswith("norm.weight") else 0.0
            p.set_value(base + paddle.randn(p.shape) * 0.5)


def randomize_mea_model(model):
    """HLC away from its init, head-norm weights and biases non-trivial."""
    import paddle

    for name, p in model.named_parameters():
        if ".mea_" in name or name.endswith(".bias"):
            p.set_value((1.0 if "mea_norm" in name else 0.0) + paddle.randn(p.shape) * 0.4)


def _mea_layer(x, tensors, cfg, positions):
    return mea_oracle.attention(x, tensors, cfg, positions)[0]


_mea_layers = _grid(
    MEA_GRID,
    lambda h, p, v, d, pos, gn, bi: dict(num_attention_heads=h, num_key_value_heads=p, mea_kv_heads=v, head_dim=d,
                                         mea_k_norm_position=pos, mea_group_norm=gn, attention_bias=bi),
    lambda b, s, h, p, v, d, pos, gn, bi: f"B{b}-S{s}-H{h}-np{p}-nv{v}-d{d}-{pos[:5]}{'-gn' if gn else ''}"
                                          f"{'-bias' if bi else ''}",
    frozenset({"mea_k_lc", "mea_v_lc"}))
_mea_ids = list(_mea_layers)

MEA = FamilyCases(
    layer_oracle=_mea_layer,
    lm_oracle=mea_oracle.causal_lm,
    layers=_mea_layers,
    gradient_cases=(_mea_ids[0], _mea_ids[2], _mea_ids[3]),
    backend_case=_mea_ids[2],
    randomize_layer=randomize_mea_layer,
    models={
        "all-after-gn": dict(num_attention_heads=6, num_key_value_heads=2, mea_kv_heads=3),
        "mixed-before-stock6": dict(num_hidden_layers=3, num_attention_heads=6, num_key_value_heads=2, mea_kv_heads=3,
                                    mea_layers=[0, 2], mea_stock_kv_heads=6, mea_k_norm_position="before_hlc"),
        "np1-nogn-bias-tied": dict(num_attention_heads=3, num_key_value_heads=1, mea_kv_heads=3, mea_group_norm=False,
                                   attention_bias=True, tie_word_embeddings=True),
        "deep-after-stock2": dict(num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=1, mea_kv_heads=4,
                                  mea_layers=[1, 2], mea_stock_kv_heads=2),
    },
    randomize_model=randomize_mea_model,
    decode_fields=dict(num_attention_heads=6, num_key_value_heads=2, mea_kv_heads=3),
    generate_fields=dict(num_hidden_layers=3, num_attention_heads=6, num_key_value_heads=2, mea_kv_heads=3,
                         mea_layers=[0, 1]),
    generate_tokens=6,
)


# --- stock Qwen3 and Qwen3 shared-KV (the fold's targets): GQA, with one K = V projection for shared-KV ---------------

# (B, S, H, H_kv, d, bias): S = 1, prime S, B > 1, odd head counts, H_kv = 1 and 3, biases.
GQA_GRID = [
    (2, 7, 4, 2, 16, False),
    (1, 1, 4, 2, 16, False),
    (3, 13, 6, 2, 16, True),
    (2, 5, 3, 1, 16, False),
    (2, 11, 9, 3, 8, True),
]


def _gqa_layer(x, tensors, cfg, positions):
    return oracle.gqa_attention(x, tensors, cfg, positions)[0]


def _gqa_cases(must_have):
    layers = _grid(GQA_GRID,
                   lambda h, hkv, d, bi: dict(num_attention_heads=h, num_key_value_heads=hkv, head_dim=d,
                                              attention_bias=bi),
                   lambda b, s, h, hkv, d, bi: f"B{b}-S{s}-H{h}-Hkv{hkv}-d{d}{'-bias' if bi else ''}", must_have)
    ids = list(layers)

    def lm(ids_, state, cfg, past=None):
        return oracle.stock_causal_lm(ids_, state, cfg, past=past)

    return FamilyCases(
        layer_oracle=_gqa_layer, lm_oracle=lm, layers=layers, gradient_cases=(ids[0], ids[4]), backend_case=ids[2],
        randomize_layer=randomize_biases,
        models={"base": dict(), "bias-3layers": dict(attention_bias=True, num_hidden_layers=3),
                "Hkv1-oddheads-tied": dict(num_attention_heads=3, num_key_value_heads=1, tie_word_embeddings=True)},
        randomize_model=randomize_postmix, generate_fields=dict(num_hidden_layers=3))


# --- Qwen3 with sinks (what a Qwen3-VHA with window_attention_sinks folds into): GQA, a sink logit per head on window
# layers. The layer checks run decoder layer 0 as a window layer whose window (64) spans the test's lengths (the shared
# layer test passes a plain causal mask); the model checks use a window of 3, shorter than their texts.

_SINK_LAYERS = dict(sliding_window=64, use_sliding_window=True, layer_types=["sliding_attention", "full_attention"])
_SINK_MODELS = dict(sliding_window=3, use_sliding_window=True, num_hidden_layers=3,
                    layer_types=["sliding_attention", "full_attention", "sliding_attention"])


def randomize_sinks(layer_or_model):
    """Biases and sinks away from their init (zeros, N(0, 0.02)): the sinks take a real share of the softmax."""
    import paddle

    for name, p in layer_or_model.named_parameters():
        if name.endswith(".bias") or name.endswith("sinks"):
            p.set_value(paddle.randn(p.shape) * (1.5 if name.endswith("sinks") else 0.5))


def _sinks_cases():
    layers = _grid(GQA_GRID,
                   lambda h, hkv, d, bi: dict(num_attention_heads=h, num_key_value_heads=hkv, head_dim=d,
                                              attention_bias=bi, **_SINK_LAYERS),
                   lambda b, s, h, hkv, d, bi: f"B{b}-S{s}-H{h}-Hkv{hkv}-d{d}{'-bias' if bi else ''}",
                   frozenset({"sinks"}))
    ids = list(layers)

    def layer(x, tensors, cfg, positions_):
        return oracle.gqa_attention(x, tensors, cfg, positions_, layer=0)[0]

    def lm(ids_, state, cfg, past=None):
        return oracle.stock_causal_lm(ids_, state, cfg, past=past)

    return FamilyCases(
        layer_oracle=layer, lm_oracle=lm, layers=layers, gradient_cases=(ids[0], ids[4]), backend_case=ids[2],
        randomize_layer=randomize_sinks,
        models={"window3": dict(_SINK_MODELS), "bias-oddheads": dict(_SINK_MODELS, attention_bias=True,
                                                                     num_attention_heads=3, num_key_value_heads=1)},
        randomize_model=randomize_sinks, decode_fields=dict(_SINK_MODELS), generate_fields=dict(_SINK_MODELS))


# --- the same layers over Llama and Qwen2: no q/k norm; Qwen2's biases on q/k/v only, Llama's with attention_bias ------
# PaddleFormers' Llama attention requires num_attention_heads x head_dim = hidden_size: every Llama config sets the
# hidden size from its heads (the oracles are the same functions, which normalise nothing without norm tensors).

def _over_base(cases: FamilyCases, layer_ids, model_ids, gradient_ids, backend_id, llama: bool) -> FamilyCases:
    """A subset of a Qwen3 family's cases (the grids' ids), over Llama (hidden = heads x d) or Qwen2."""
    def sized(f):
        if not llama:
            return dict(f)
        heads, d = f.get("num_attention_heads", TINY["num_attention_heads"]), f.get("head_dim", TINY["head_dim"])
        # LlamaConfig's special ids (pad 0, bos 1, eos 2) fall inside the tiny vocabulary: generate would read a
        # random prompt's 0 as padding and stop at a 2
        return dict(f, hidden_size=heads * d, pad_token_id=None, bos_token_id=None, eos_token_id=None)

    layers = {i: LayerCase(c.B, c.S, sized(c.fields), c.must_have) for i, c in cases.layers.items() if i in layer_ids}
    return FamilyCases(
        layer_oracle=cases.layer_oracle, lm_oracle=cases.lm_oracle, layers=layers, gradient_cases=tuple(gradient_ids),
        backend_case=backend_id, randomize_layer=cases.randomize_layer,
        models={i: sized(f) for i, f in cases.models.items() if i in model_ids}, randomize_model=cases.randomize_model,
        decode_fields=sized(cases.decode_fields), generate_fields=sized(cases.generate_fields),
        generate_tokens=cases.generate_tokens, sizes=sized({}))


_QWEN3 = _gqa_cases(frozenset({"k_proj.weight", "v_proj.weight"}))
_GQA_IDS, _VHA_IDS, _MEA_IDS = list(_QWEN3.layers), _vha_ids, _mea_ids
_GQA_OVER = dict(layer_ids=_GQA_IDS[:4], model_ids=("base", "Hkv1-oddheads-tied"), gradient_ids=_GQA_IDS[2:3],
                 backend_id=_GQA_IDS[2])
# VHA: r < d, gated, bias, odd heads, no Premix (shared-KV needs Qwen3's folded form: refused over these bases)
_VHA_OVER = dict(layer_ids=[_VHA_IDS[i] for i in (0, 1, 3, 4, 5, 12, 13)], model_ids=("base", "gated-bias", "nopremix"),
                 gradient_ids=(_VHA_IDS[3], _VHA_IDS[5], _VHA_IDS[12]), backend_id=_VHA_IDS[4])
_MEA_OVER = dict(layer_ids=_MEA_IDS[:5], model_ids=("all-after-gn", "mixed-before-stock6"),
                 gradient_ids=(_MEA_IDS[2], _MEA_IDS[3]), backend_id=_MEA_IDS[2])

CASES: Dict[str, FamilyCases] = {
    "qwen3": _QWEN3,
    "qwen3_vha": VHA,
    "qwen3_mea": MEA,
    "qwen3_shared_kv": _gqa_cases(frozenset({"shared_kv_proj.weight"})),
    "qwen3_sinks": _sinks_cases(),
    **{f"{base}{suffix}": _over_base(cases, **over, llama=base == "llama")
       for base in ("llama", "qwen2")
       for suffix, cases, over in (("", _QWEN3, _GQA_OVER), ("_vha", VHA, _VHA_OVER), ("_mea", MEA, _MEA_OVER))},
}


def positions(B: int, S: int) -> np.ndarray:
    return np.broadcast_to(np.arange(S), (B, S))


# --- Qwen3-VHA causal LMs with sliding-window layers (tests/test_vha_window.py, tests/test_attention_sinks.py) ----------

WINDOW = 4  # the window: a query sees its own position and the 3 before it
WINDOW_LAYERS = dict(sliding_window=WINDOW, use_sliding_window=True, num_hidden_layers=3,
                     layer_types=["sliding_attention", "full_attention", "sliding_attention"])


def make_vha_model(fields: Dict, attn: str = "eager"):
    """(cfg, eval-mode Qwen3VHAForCausalLM) over TINY with `fields`: Postmix and biases away from their init, the
    norm weights 1 + 0.3 N(0, 1), sink logits (where the config has them) 1.5 N(0, 1), large enough to take a real
    share of the softmax."""
    import paddle

    from _utils import tiny_config
    from paddle_vha import Qwen3VHAForCausalLM

    cfg = tiny_config(**fields)
    cfg._attn_implementation = attn
    model = Qwen3VHAForCausalLM(cfg)
    model.eval()
    randomize_postmix(model)
    for n, p in model.named_parameters():
        if n.endswith("norm.weight"):  # ones at init: make them count
            p.set_value(1.0 + paddle.randn(p.shape) * 0.3)
        if n.endswith("self_attn.sinks"):
            p.set_value(paddle.randn(p.shape) * 1.5)
    return cfg, model


def saved_state(model) -> Dict[str, np.ndarray]:
    """The model's tensors as save_pretrained writes them (Linear weights [out, in]), float64."""
    import tempfile

    from _utils import load_checkpoint_numpy

    with tempfile.TemporaryDirectory() as d:
        model.save_pretrained(d)
        return load_checkpoint_numpy(d)


def greedy_by_full_forwards(model, prompt, steps: int):
    """`steps` greedy tokens after `prompt` (B, P), each from a full forward of everything so far (no cache)."""
    import paddle

    seq = prompt
    for _ in range(steps):
        seq = paddle.concat([seq, model(seq, return_dict=True).logits[:, -1].argmax(-1, keepdim=True)], axis=1)
    return seq[:, prompt.shape[1]:].numpy()


def attention_gradient_errors(model, cfg, ids: np.ndarray) -> Dict[str, float]:
    """Paddle's fp32 autograd through the whole model vs central differences of the float64 oracle
    (oracle.causal_lm), one random direction per attention tensor of every layer (the rest is stock Qwen3):
    {tensor: relative error}, printed per tensor."""
    import paddle

    from _utils import config_dict, to_numpy

    model.train()
    logits = model(paddle.to_tensor(ids), return_dict=True).logits
    g_out = np.random.randn(*logits.shape)
    (logits * paddle.to_tensor(g_out, dtype="float32")).sum().backward()
    state, c = saved_state(model), config_dict(cfg)
    grads = {}
    for n, p in model.named_parameters():
        g = to_numpy(p.grad)
        grads[n] = g.T if n.endswith("_proj.weight") else g  # Paddle Linear: [in, out]
        assert grads[n].shape == state[n].shape, n

    def loss(s):
        return float((oracle.causal_lm(ids, s, c)[0] * g_out).sum())

    eps, errors = 1e-6, {}
    for n in sorted(n for n in state if "self_attn" in n):
        direction = np.random.randn(*state[n].shape)
        fd = (loss({**state, n: state[n] + eps * direction}) - loss({**state, n: state[n] - eps * direction})) / (2 * eps)
        an = float((grads[n] * direction).sum())
        errors[n] = abs(fd - an) / max(abs(fd), np.linalg.norm(grads[n]), 1e-12)
        print(f"{n}: autograd {an:+.6e} finite-diff {fd:+.6e} rel err {errors[n]:.2e}")
    return errors
