"""Tensors declared once: a decoder layer's parameters as data, and the generic code every concern runs over them.

A variant lists the tensors of its decoder layer as `Param`s, in the spirit of Hugging Face's `base_model_tp_plan`:

    Param("self_attn.q_norm.weight", shape=lambda s: (s.head_dim,), shard=SUMMED)   # whole, gradient summed

Each Param says, in one place:

* `shape(sizes)` - its on-disk (Hugging Face layout) shape for the layer's sizes (an object the variant builds per
  layer: `LayerSpec.sizes(cfg, i)`);
* `shard` - how tensor parallelism holds it in memory (a `TensorShard`, or a function of the rank's head layout, e.g.
  split when the KV heads are split and whole otherwise);
* `linear` - a Linear weight: [out, in] on disk, [in, out] in memory (flex-checkpoint needs a transpose rule);
* `fold` - where fold puts it: None (copied as it is) or the `FoldRule` that absorbs it (paddle_vha/spec/fold.py:
  the Linear it goes into and the math);
* `serve` - None, or the attribute under which the exported decoder's layer form carries it as a graph constant
  (the window layers' sink logits: `sinks`; paddle_vha/qwen3/serving.py);
* `when(sizes)` - whether this layer has it at all (a bias with attention_bias, the gate with gated attention, ...);
* `init(sizes, config)` - the initializer of a tensor that is not a Linear's (Premix, Postmix, HLC ...): called when the
  layer is built (paddle_vha/modeling/parameters.py), so it may import Paddle; Linears get Paddle's default.

`linear(...)` declares a Linear's weight and bias together: the bias follows the weight's split (a column-parallel
weight has a split bias, a row-parallel one a whole bias added after the all-reduce, a replicated one a replicated
bias). What is derived from the declarations (no Paddle needed):

    layer_shapes(spec, cfg, i)      the layer's tensor contract {name: shape}
    layer_shards(spec, cfg, i, lay) its tensor-parallel shards {name: TensorShard} for one rank's layout
    extra_linears(spec, cfg, i)     Linears the base's flex-checkpoint rules do not know (they need a transpose rule)
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple, Union

from .sharding import REPLICATED_SUMMED, TensorShard

__all__ = ["Param", "LayerSpec", "ModelSpec", "TensorShard", "linear", "COLUMN", "ROW", "WHOLE", "SUMMED", "split_kv", "layer_shapes",
           "layer_shards", "extra_linears", "layer_params"]

Sizes = Any  # the variant's per-layer sizes object (LayerSpec.sizes)
ShardRule = Union[TensorShard, Callable[[Any], TensorShard]]

COLUMN = TensorShard(1)  # a Linear split by output features ([in, out] in memory: axis 1)
ROW = TensorShard(0)  # a Linear split by input features: its partial products are all-reduced
WHOLE = TensorShard(None)  # whole on every rank, full gradient (every rank computes the same thing)
SUMMED = REPLICATED_SUMMED  # whole on every rank, each rank's gradient a part: summed by a hook


def _always(_sizes) -> bool:
    return True


@dataclass(frozen=True)
class Param:
    """One tensor of a decoder layer. `name` is relative to the layer ("self_attn.q_proj.weight")."""

    name: str
    shape: Callable[[Sizes], Tuple[int, ...]]
    shard: ShardRule = WHOLE
    linear: bool = False
    fold: Optional[Any] = None  # a spec.fold.FoldRule
    when: Callable[[Sizes], bool] = _always
    init: Optional[Callable[[Sizes, Any], Any]] = None
    serve: Optional[str] = None

    def shard_for(self, layout) -> TensorShard:
        return self.shard(layout) if callable(self.shard) else self.shard


def split_kv(split: TensorShard) -> Callable[[Any], TensorShard]:
    """`split` when the rank's layout splits the KV heads (t <= KV heads), else whole with a summed gradient."""
    return lambda lay: split if lay.kv_sharded else SUMMED


def _bias_shard(weight: ShardRule) -> ShardRule:
    """The bias of a Linear follows its weight: split with the output columns, whole after a row-parallel reduce."""
    def rule(w: TensorShard) -> TensorShard:
        if w.axis == 1:
            return TensorShard(0)  # column-parallel: the bias is split as the outputs are
        if w.axis == 0:
            return WHOLE  # row-parallel: added once after the all-reduce
        return w  # replicated: as the weight
    return (lambda lay: rule(weight(lay))) if callable(weight) else rule(weight)


def linear(name: str, out: Callable[[Sizes], int], inp: Callable[[Sizes], int], shard: ShardRule,
           bias: Optional[Callable[[Sizes], bool]] = lambda s: s.bias, when: Callable[[Sizes], bool] = _always,
           fold: Optional[Any] = None) -> Tuple[Param, ...]:
    """A Linear `name` ("self_attn.q_proj"): its weight [out, in] on disk, and its bias [out] where `bias(sizes)`
    holds (bias=None: a Linear that never has one)."""
    weight = Param(f"{name}.weight", lambda s: (out(s), inp(s)), shard, linear=True, fold=fold, when=when)
    if bias is None:
        return (weight,)
    b = Param(f"{name}.bias", lambda s: (out(s),), _bias_shard(shard), fold=fold, when=lambda s: when(s) and bias(s))
    return weight, b


@dataclass(frozen=True)
class LayerSpec:
    """The tensors of one kind of decoder layer, and how to size them from a config.

    `sizes(cfg, i)` returns the object the Param functions read (head counts, widths, flags of layer i);
    `params` is the full list of the layer's tensors (the base's and the variant's together, each declared once).
    """

    name: str
    sizes: Callable[[Any, int], Sizes]
    params: Tuple[Param, ...]
    base_linears: Tuple[str, ...] = field(default=())  # Linears the base model's own checkpoint rules already know

    def replace(self, name: str, sizes=None, drop: Iterable[str] = (), add: Iterable[Param] = ()) -> "LayerSpec":
        """A derived spec (a variant overrides only what differs): the same tensors less `drop` (a tensor's name, or
        a Linear's name for its weight and bias), with each Param of `add` in place of the one of the same name, or
        appended."""
        add = {p.name: p for p in add}
        params = []
        for p in self.params:
            if p.name in add:
                params.append(add.pop(p.name))  # replaced where the base has it
            elif not any(p.name == d or p.name.startswith(d + ".") for d in drop):
                params.append(p)
        return LayerSpec(name, sizes or self.sizes, tuple(params) + tuple(add.values()), self.base_linears)


def layer_params(spec: LayerSpec, cfg, layer_idx: int) -> List[Tuple[Param, Sizes]]:
    """The Params layer `layer_idx` has (their `when` holds), with the layer's sizes."""
    s = spec.sizes(cfg, layer_idx)
    return [(p, s) for p in spec.params if p.when(s)]


def layer_shapes(spec: LayerSpec, cfg, layer_idx: int, prefix: str) -> Dict[str, Tuple[int, ...]]:
    """{prefix + name: on-disk shape} for every tensor of layer `layer_idx`."""
    return {prefix + p.name: tuple(p.shape(s)) for p, s in layer_params(spec, cfg, layer_idx)}


def layer_shards(spec: LayerSpec, cfg, layer_idx: int, layout) -> Dict[str, TensorShard]:
    """{name: in-memory shard} of every tensor of layer `layer_idx` for one rank's head layout."""
    return {p.name: p.shard_for(layout) for p, _ in layer_params(spec, cfg, layer_idx)}


def extra_linears(spec: LayerSpec, cfg, layer_idx: int = 0) -> List[str]:
    """Linear weights of the layer the base's checkpoint name rules do not know ("self_attn.gate_proj")."""
    return [p.name[: -len(".weight")] for p, _ in layer_params(spec, cfg, layer_idx)
            if p.linear and p.name[: -len(".weight")] not in spec.base_linears]


@dataclass(frozen=True)
class ModelSpec:
    """A family's tensors: the model-level ones (embedding, final norm, LM head) and the spec of each decoder layer.

    `layer(cfg, i)` picks layer i's LayerSpec (a family may mix kinds of layer, e.g. MEA and stock layers)."""

    top: Tuple[Param, ...]
    top_sizes: Callable[[Any], Sizes]
    layer: Callable[[Any, int], LayerSpec]
    layer_prefix: Callable[[int], str] = lambda i: f"model.layers.{i}."

    def tensor_shapes(self, cfg) -> Dict[str, Tuple[int, ...]]:
        """The on-disk tensor contract: every tensor name -> its Hugging Face-layout shape."""
        s = self.top_sizes(cfg)
        shapes = {p.name: tuple(p.shape(s)) for p in self.top if p.when(s)}
        for i in range(cfg.num_hidden_layers):
            shapes.update(layer_shapes(self.layer(cfg, i), cfg, i, self.layer_prefix(i)))
        return shapes

    def layer_shards(self, cfg, layer_idx: int, layout) -> Dict[str, TensorShard]:
        return layer_shards(self.layer(cfg, layer_idx), cfg, layer_idx, layout)

    def served_constants(self, cfg, layer_idx: int) -> Dict[str, str]:
        """{tensor name: the serving form's attribute} of layer `layer_idx`'s tensors served as graph constants."""
        prefix = self.layer_prefix(layer_idx)
        params = layer_params(self.layer(cfg, layer_idx), cfg, layer_idx)
        return {prefix + p.name: p.serve for p, _ in params if p.serve}

    def extra_linears(self, cfg) -> List[str]:
        """Linears of any layer that the base's flex-checkpoint rules do not know, each named once."""
        names = {n for i in range(cfg.num_hidden_layers) for n in extra_linears(self.layer(cfg, i), cfg, i)}
        return sorted(names)

    def dropped_base_linears(self, cfg) -> List[str]:
        """Linears of the base layer some layer of this family does not have (their base rules must go)."""
        have = {p.name[: -len(".weight")] for i in range(cfg.num_hidden_layers)
                for p, _ in layer_params(self.layer(cfg, i), cfg, i) if p.linear}
        base = {n for i in range(cfg.num_hidden_layers) for n in self.layer(cfg, i).base_linears}
        return sorted(base - have)
