"""Fold roles as data, and the generic walk over a spec that says what fold makes of every tensor.

A tensor that fold absorbs names its `FoldRule` in its `Param` (paddle_vha/spec/params.py, `fold=`): the Linear it is
absorbed into and the rule's math per leaf of that Linear. VHA's Premix is one (absorbed into q_proj: weight and
bias), its Postmix U and V another (absorbed into o_proj's weight: paddle_vha/vha/fold_rules.py). Everything no rule
names is copied. Pure Python: the math is a function the variant gives, called on whatever arrays the caller reads.

    layer_fold(spec, cfg, i, prefix)   layer i: {output tensor: FoldStep}, the absorbed tensors' names
    model_fold(model_spec, cfg)        the same over every layer

What a whole checkpoint folds into (the folded model_type and its config.json, refusals, notes, the plan's header) is a
`FoldForm`, which a foldable family's registry entry names (`Family.fold_ref`); a variant overrides what differs
(paddle_vha/vha/fold_form.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, List, Mapping, Optional, Tuple

from .params import LayerSpec, ModelSpec, layer_params

__all__ = ["FoldRule", "FoldStep", "FoldForm", "layer_fold", "model_fold"]


@dataclass(frozen=True, eq=False)  # identity: two rules with the same target are still two rules
class FoldRule:
    """Tensors absorbed into the Linear `into` (relative to the layer, "self_attn.q_proj"); `label` is how a plan
    names the step ("fold Premix"); `math[leaf](linear's tensor, *absorbed tensors in spec order)` is the folded
    tensor of that leaf ("weight", "bias"), float64. A leaf the layer does not have (a bias without attention_bias) is
    skipped; a leaf `math` does not name is copied."""

    into: str
    label: str
    math: Mapping[str, Callable]


@dataclass(frozen=True)
class FoldStep:
    """How one output tensor is made: `rule.math[leaf](*sources)`, sources[0] the tensor itself."""

    rule: FoldRule
    leaf: str
    sources: Tuple[str, ...]

    def apply(self, read: Callable):
        """The folded tensor, reading each source with `read(name)`."""
        return self.rule.math[self.leaf](*[read(s) for s in self.sources])


def layer_fold(spec: LayerSpec, cfg, layer_idx: int, prefix: str) -> Tuple[Dict[str, FoldStep], Tuple[str, ...]]:
    """({output name: its FoldStep}, absorbed names) of layer `layer_idx` (only the tensors the layer has)."""
    params = layer_params(spec, cfg, layer_idx)
    present = {p.name for p, _ in params}
    rules = list(dict.fromkeys(p.fold for p, _ in params if p.fold is not None))  # in declaration order
    steps: Dict[str, FoldStep] = {}
    absorbed = []
    for rule in rules:
        inputs = tuple(prefix + p.name for p, _ in params if p.fold is rule)
        absorbed += inputs
        for leaf in rule.math:
            if f"{rule.into}.{leaf}" in present:
                target = f"{prefix}{rule.into}.{leaf}"
                steps[target] = FoldStep(rule, leaf, (target, *inputs))
    return steps, tuple(absorbed)


def model_fold(spec: ModelSpec, cfg) -> Tuple[Dict[str, FoldStep], Tuple[str, ...]]:
    """layer_fold over every decoder layer of a family's spec."""
    steps: Dict[str, FoldStep] = {}
    absorbed = []
    for i in range(cfg.num_hidden_layers):
        s, a = layer_fold(spec.layer(cfg, i), cfg, i, spec.layer_prefix(i))
        steps.update(s)
        absorbed += a
    return steps, tuple(absorbed)


class FoldForm:
    """What a family's checkpoints fold into, over its config object (cfg) or its config.json (raw): by default the
    family `into` (a model_type), nothing refused, no note, config.json as it is less the keys starting with
    `drop_prefix` and those in `drop_keys`."""

    drop_prefix: Optional[str] = None  # config.json keys the folded model does not have: this prefix ...
    drop_keys: Tuple[str, ...] = ("auto_map",)  # ... and these
    verify_numpy = False  # --verify in Paddle (True: a family with no Paddle model, both sides in float64 numpy)

    def __init__(self, into: Optional[str] = None):
        self.into = into

    def refusal(self, cfg) -> Optional[str]:
        """Why `cfg` has no exact folded form (one line, without the path), or None."""
        return None

    def target(self, raw: Mapping) -> str:
        """The model_type config.json `raw` folds into."""
        return self.into

    def notes(self, cfg, raw: Mapping) -> List[str]:
        """One-line announcements the fold prints (what the folded model is, where it is not the obvious one)."""
        return []

    def dropped(self, raw: Mapping) -> List[str]:
        """The keys of `raw` the plan says it drops."""
        return sorted(k for k in raw if self.drop_prefix and k.startswith(self.drop_prefix))

    def config(self, raw: Mapping, architecture: str, dtype: Optional[str] = None) -> dict:
        """config.json of the folded model, `architecture` its causal LM class, `dtype` its stored dtype."""
        out = {k: v for k, v in raw.items()
               if not (self.drop_prefix and k.startswith(self.drop_prefix)) and k not in self.drop_keys}
        out["model_type"] = self.target(raw)
        out["architectures"] = [architecture]
        if dtype is not None:
            if "dtype" in raw:
                out["dtype"] = dtype
            if "torch_dtype" in raw or "dtype" not in raw:
                out["torch_dtype"] = dtype
        return out

    def header(self, cfg, source: str, target: str, dtype: str) -> List[str]:
        """The plan's header lines."""
        return [f"{source}: {cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}", f"-> {target}: dtype {dtype}"]
