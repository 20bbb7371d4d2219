"""Apply a family's tensor-parallel plan to a built model, from outside its math (torchtitan style).

    model = Qwen3VHAForCausalLM(config)             # single-device model, same seed on every rank
    parallelize_model(model, group)                 # now rank k holds its slices; forward/backward are TP

The plan comes from the family registry (paddle_vha/families.py: the family's tp_plan module) as data, one
LayerPlan per decoder layer (paddle_vha/spec/sharding.py). This module applies any LayerPlan the same way:

* parameters it splits are replaced by this rank's slice (marked `is_distributed`); whole ones it marks get a
  gradient-summing hook;
* row-parallel Linears (o_proj, down_proj) become RowParallelLinear (all-reduce of the partial products, then the
  bias), whole Linears that compute only some output columns become ColumnSliceLinear: new sublayers holding the same
  parameters, so names and the state dict are unchanged;
* attributes it lists are set on the sublayers: the local head counts, and the settings the layers' hooks read
  (VHA's `premix_groups`, MEA's `hlc_columns`); collectives it names are bound to the group and set on the layers'
  hook attributes (VHA's `postmix_reduce`);
* the inputs of the attention and the MLP enter the TP region through forward pre-hooks (`copy_to_tp`).

The layer code itself is untouched and still reads as single-device math. All communication is the PyLayers of
collectives.py on plain dist.all_reduce / all_gather (gloo and NCCL alike).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Optional, Tuple

import numpy as np
import paddle
import paddle.distributed as dist
from paddle import nn
from paddle.nn import functional as F

from ..checkpoint.load import load_checkpoint_into
from ..families import family_of, trainable_with_plan
from .collectives import (
    all_reduce_partial,
    allreduce_grad_hook,
    copy_to_tp,
    group_rank,
    group_size,
    reduce_from_tp,
)
from ..spec.sharding import LayerPlan, TensorShard, TPPlanError
from .sequence import all_gather_seq, install_sequence_hooks, reduce_scatter_seq, sp_grad_sum_rule
from .pipe_vocab import apply_pipe_vocab_plan, is_pipe_stage, pipe_vocab_params
from .vocab import apply_vocab_plan, check_vocab_split, vocab_params

__all__ = [
    "TPState",
    "RowParallelLinear",
    "ColumnSliceLinear",
    "build_tensor_parallel_model",
    "check_plan",
    "full_state",
    "global_grad_norm",
    "layer_plans",
    "parallelize_model",
    "replica_divergence",
    "tp_state",
]

COLLECTIVES = {"all_reduce_partial": all_reduce_partial}  # what a plan may name for a layer hook


@dataclass
class TPState:
    """What parallelize_model did: size, rank, group and the shard of every parameter (by its name); `aliases`:
    other names of a parameter (a tied LM head: {"lm_head.weight": "model.embed_tokens.weight"})."""

    t: int
    rank: int
    group: object
    shards: Dict[str, TensorShard]
    vocab_parallel: bool = False
    sequence_parallel: bool = False
    sequence_summed: Tuple[str, ...] = ()  # whole weights used on the rank's tokens only: gradients summed (SP)
    aliases: Dict[str, str] = field(default_factory=dict)

    def shard(self, name: str) -> TensorShard:
        return self.shards.get(name, TensorShard(None))


def tp_state(model) -> Optional[TPState]:
    """The TPState of a parallelized model, or None for a single-device one."""
    return getattr(model, "_vha_tp_state", None)


# --- plans from the registry -----------------------------------------------------------------------------------------

def _plan_module(config):
    fam = family_of(config)
    if fam.tp_plan is None:
        raise TPPlanError(f"{fam.label} has no tensor-parallel plan in paddle_vha.parallel")
    return fam.tp_plan


def check_plan(config, t: int) -> None:
    """TPPlanError (one line) if the config's family cannot shard it over t ranks."""
    _plan_module(config).check(config, t)


def layer_plans(config, t: int, rank: int):
    """Rank `rank`'s LayerPlan of every decoder layer."""
    plan = _plan_module(config)
    plan.check(config, t)
    return [plan.layer_plan(config, t, rank, i) for i in range(config.num_hidden_layers)]


# --- the parallel sublayers ------------------------------------------------------------------------------------------

class RowParallelLinear(nn.Layer):
    """A Linear whose weight holds this rank's input rows: all-reduce of the partial products, then the bias. With
    `sequence_parallel` a reduce-scatter along the sequence instead (this rank's tokens of the sum)."""

    def __init__(self, linear: nn.Linear, group, sequence_parallel: bool = False):
        super().__init__()
        self.weight, self.bias, self._tp_group = linear.weight, linear.bias, group
        self._tp_reduce = reduce_scatter_seq if sequence_parallel else reduce_from_tp

    def forward(self, x):
        out = self._tp_reduce(F.linear(x, self.weight), self._tp_group)
        return out if self.bias is None else out + self.bias


class ColumnSliceLinear(nn.Layer):
    """A Linear with its whole (replicated) weight, computing only output columns [a, b) on this rank."""

    def __init__(self, linear: nn.Linear, cols):
        super().__init__()
        self.weight, self.bias, self._tp_cols = linear.weight, linear.bias, tuple(cols)

    def forward(self, x):
        a, b = self._tp_cols
        return F.linear(x, self.weight[:, a:b], None if self.bias is None else self.bias[a:b])


def _enter_region_hook(group, sequence_parallel: bool = False):
    """Forward pre-hook: the layer's input (`hidden_states` / its first argument) enters the TP region. Every rank reads
    the whole x (identity forward); the gradient of x is the sum of the ranks' parts (all-reduce backward). With
    sequence_parallel the input is this rank's tokens: all-gathered (backward: reduce-scatter)."""
    enter = all_gather_seq if sequence_parallel else copy_to_tp

    def hook(layer, args, kwargs):
        if "hidden_states" in kwargs:
            kwargs = dict(kwargs, hidden_states=enter(kwargs["hidden_states"], group))
        else:
            args = (enter(args[0], group),) + tuple(args[1:])
        return args, kwargs

    return hook


# --- parameters ----------------------------------------------------------------------------------------------------

def _replace_param(owner, attr: str, value: paddle.Tensor, distributed: bool):
    old = getattr(owner, attr)
    p = paddle.create_parameter(shape=list(value.shape), dtype=value.dtype)
    p.set_value(value)
    for a in ("stop_gradient", "optimize_attr", "regularizer", "need_clip", "do_model_average"):
        if hasattr(old, a):
            setattr(p, a, getattr(old, a))
    p.is_distributed = distributed
    setattr(owner, attr, p)
    return p


def _sublayer(root, path: str):
    layer = root
    for part in path.split(".") if path else []:
        layer = getattr(layer, part)
    return layer


def _owner(root, name: str):
    path, _, attr = name.rpartition(".")
    return _sublayer(root, path), attr


def _sync_from_first_rank(model, group):
    src = group.ranks[0] if group is not None else 0
    with paddle.no_grad():
        for _, p in model.named_parameters():
            dist.broadcast(p, src=src, group=group)


def _decoder_layers(model):
    """(parameter-name prefix, layer index, layer) of every decoder layer `model` holds: a causal LM's or a backbone's
    `layers`, or the decoder layers of one pipeline stage (paddle_vha/modeling/pipe.py: the stage's sublayers are
    named by their place in the pipe's sequence, and each knows its index)."""
    if hasattr(model, "model") and hasattr(model.model, "layers"):
        return [(f"model.layers.{i}.", i, layer) for i, layer in enumerate(model.model.layers)]
    if hasattr(model, "layers"):
        return [(f"layers.{i}.", i, layer) for i, layer in enumerate(model.layers)]
    return [(f"{name}.", layer.self_attn.layer_idx, layer) for name, layer in model.named_children()
            if hasattr(layer, "self_attn")]


def _layer_of(name: str, layers):
    """(layer index, name inside the layer) of parameter `name` if a decoder layer holds it, else None."""
    for prefix, i, _ in layers:
        if name.startswith(prefix):
            return i, name[len(prefix):]
    return None


def parallelize_model(model, group=None, sync_from_first_rank: bool = True, vocab_parallel: bool = False,
                      sequence_parallel: bool = False) -> TPState:
    """Shard a built causal LM (or backbone) of a family with a tensor-parallel plan over `group` in place.

    Build the model at tensor_model_parallel_size=1 on every rank first. With sync_from_first_rank (default) the
    whole model is broadcast from the group's first rank before slicing, so every rank starts from the same
    weights whatever its seed. Create the optimizer afterwards (the sharded parameters are new tensors).
    vocab_parallel: split the embedding and LM head by vocabulary row as well (paddle_vha/parallel/vocab.py; the
    vocabulary must divide by t); otherwise they stay whole on every rank. sequence_parallel: between the TP regions
    each rank holds s/t tokens of every sequence (paddle_vha/parallel/sequence.py; a causal LM, s divisible by t).
    """
    if tp_state(model) is not None:
        raise RuntimeError("model is already tensor-parallel")
    config = model.config
    if getattr(config, "tensor_model_parallel_size", 1) > 1:
        raise RuntimeError("build the model at tensor_model_parallel_size=1 and let parallelize_model shard it "
                           "(see docs/tensor_parallel.md)")
    layers = _decoder_layers(model)
    fam = family_of(config)
    if fam.tp_plan is None:
        kinds = sorted({type(layer.self_attn).__name__ for _, _, layer in layers})
        labels = [f.label for f in trainable_with_plan()]
        listed = ", ".join(labels[:-1]) + f" and {labels[-1]}" if len(labels) > 1 else labels[0]
        raise TypeError(f"paddle_vha.parallel shards {listed} attention only; this model has {', '.join(kinds)}")
    t, rank = group_size(group), group_rank(group)
    plans = layer_plans(config, t, rank)
    _refuse_master_grad_hooks(model)
    vocab_parallel, sequence_parallel = vocab_parallel and t > 1, sequence_parallel and t > 1
    if sequence_parallel and not (hasattr(model, "model") and hasattr(model.model, "norm")):
        raise RuntimeError("sequence_parallel needs a causal LM with its backbone (model.model, its final norm)")
    vocab, tied = _vocab_setup(model, config, t) if vocab_parallel else ({}, False)
    if t > 1 and sync_from_first_rank:
        _sync_from_first_rank(model, group)
    sp_vocab = set(vocab_params(model)) if sequence_parallel else None
    shards, sp_summed = _shard_parameters(model, layers, plans, vocab, group, sp_vocab)
    if t > 1:
        for _, i, layer in layers:
            _apply_layer_plan(layer, plans[i], group, sequence_parallel)
    if sequence_parallel:
        install_sequence_hooks(layers[0][2], model.model.norm, group)
    aliases = _apply_vocab(model, group, tied) if vocab_parallel else {}
    state = TPState(t=t, rank=rank, group=group, shards=shards, vocab_parallel=vocab_parallel, aliases=aliases,
                    sequence_parallel=sequence_parallel, sequence_summed=sp_summed)
    model._vha_tp_state = state
    return state


def _shard_parameters(model, layers, plans, vocab, group, sp_vocab):
    """Every parameter's shard by name: split ones replaced by this rank's slice, whole ones with partial gradients
    given the summing hook. sp_vocab: with sequence parallelism, the embedding's and head's names (else None).
    Returns ({name: shard}, the names whose gradients are summed because of sequence parallelism)."""
    t, rank = group_size(group), group_rank(group)
    shards: Dict[str, TensorShard] = {}
    sp_summed = []
    for name, p in dict(model.named_parameters()).items():
        where = _layer_of(name, layers)
        rule = plans[where[0]].params.get(where[1]) if where else vocab.get(name)
        if where and rule is None:  # every tensor of a decoder layer is declared with its shard (the family's spec.py)
            raise RuntimeError(f"{name}: the {family_of(model.config).label} tensor-parallel plan has no rule for "
                               "this parameter")
        if sp_vocab is not None:
            sp_rule = sp_grad_sum_rule(name, where, rule, plans[where[0]] if where else None, sp_vocab)
            if sp_rule != rule:
                sp_summed.append(name)
            rule = sp_rule
        if rule is None or t == 1:
            continue
        shards[name] = rule
        if rule.axis is None:
            if rule.grad_sum:
                p.register_hook(allreduce_grad_hook(group))
            continue
        n = p.shape[rule.axis]
        if n % t:
            raise RuntimeError(f"{name}: size {n} along axis {rule.axis} is not divisible by t={t}")
        with paddle.no_grad():
            local = paddle.slice(p, [rule.axis], [rank * n // t], [(rank + 1) * n // t]).clone()
        owner, attr = _owner(model, name)
        _replace_param(owner, attr, local, distributed=True)
    return shards, tuple(sp_summed)


def _vocab_setup(model, config, t: int):
    """({name: shard} of the vocabulary parameters, whether the LM head is tied to the embedding)."""
    check_vocab_split(config.vocab_size, t)
    if is_pipe_stage(model):  # one pipeline stage: its own embedding and / or head (pipe_vocab.py)
        return pipe_vocab_params(model), False
    head = getattr(model, "lm_head", None)
    embedding = (model.model if hasattr(model, "model") else model).embed_tokens.weight
    return vocab_params(model), head is not None and head.weight is embedding


def _apply_vocab(model, group, tied: bool) -> Dict[str, str]:
    """The vocabulary-parallel layers installed (vocab.py; a pipeline stage's: pipe_vocab.py); the tied aliases."""
    if is_pipe_stage(model):
        apply_pipe_vocab_plan(model, group, bool(getattr(model.config, "tensor_parallel_output", True)))
        return {}
    return apply_vocab_plan(model, group, tied)


def _refuse_master_grad_hooks(model) -> None:
    """The plan's gradient-summing hooks must run before PaddleFormers' master-grad hook (MixPrecisionLayer with
    amp_master_grad), which moves each gradient into an fp32 `main_grad` and clears it: hooks run in registration
    order, so the plan must be applied first (docs/tensor_parallel.md, "Master gradients")."""
    if any(hasattr(p, "main_grad") for p in model.parameters()):
        raise RuntimeError("parallelize_model: the model already carries master-grad hooks (MixPrecisionLayer / "
                           "amp_master_grad); shard it first, then wrap it, so the gradients are summed before they "
                           "move into main_grad")


def _apply_layer_plan(layer, plan: LayerPlan, group, sequence_parallel: bool = False) -> None:
    """Everything of one LayerPlan but the parameter slicing (done by name for the whole model)."""
    for path, cols in plan.column_slices.items():
        owner, attr = _owner(layer, path)
        setattr(owner, attr, ColumnSliceLinear(getattr(owner, attr), cols))
    for path in plan.row_parallel:
        owner, attr = _owner(layer, path)
        setattr(owner, attr, RowParallelLinear(getattr(owner, attr), group, sequence_parallel))
    for path, attrs in plan.attributes.items():
        sub = _sublayer(layer, path)
        for key, value in attrs.items():
            setattr(sub, key, value)
    for target, name in plan.collectives.items():
        owner, attr = _owner(layer, target)
        fn = COLLECTIVES[name]
        setattr(owner, attr, lambda x, _fn=fn: _fn(x, group))
    for path in plan.enter_region:
        _sublayer(layer, path).register_forward_pre_hook(_enter_region_hook(group, sequence_parallel),
                                                         with_kwargs=True)


def build_tensor_parallel_model(model_cls, config, group=None, sync_from_first_rank: bool = True,
                                weights_from: Optional[str] = None, vocab_parallel: bool = False,
                                tensor_parallel_output: bool = False, sequence_parallel: Optional[bool] = None):
    """The entry point for trainers: build `model_cls(config)` single-device, then shard it over `group`.

    `config.tensor_model_parallel_size` may say t (as PaddleFormers' Trainer sets it); the model is built with a
    copy at 1 (the plan, not fleet's layers, does the sharding) and must equal the group size. `weights_from`: a
    checkpoint folder (the single-device contract, e.g. tools/compress_kv.py's output or a merged TP save) whose
    weights every rank loads before slicing (paddle_vha.checkpoint.load: no PaddleFormers loader inside the ranks).
    vocab_parallel: the embedding and LM head split by vocabulary row too; tensor_parallel_output (with it): the
    head returns this rank's logits and the criterion computes the parallel cross-entropy (else whole logits).
    sequence_parallel (None: `config.sequence_parallel`, as PaddleFormers' Trainer sets it): applied by the plan
    (paddle_vha/parallel/sequence.py); the model itself is built without it.
    """
    import copy

    t = group_size(group)
    want = getattr(config, "tensor_model_parallel_size", 1)
    if want not in (1, t):
        raise RuntimeError(f"config.tensor_model_parallel_size={want} but the tensor-parallel group has {t} ranks")
    config.check_runtime_support(tensor_parallel_plan=True)  # fused qkv: still refused
    if sequence_parallel is None:
        sequence_parallel = bool(getattr(config, "sequence_parallel", False))
    cfg = copy.deepcopy(config)
    cfg.tensor_model_parallel_size, cfg.sequence_parallel = 1, False  # the plan shards, not PaddleFormers' layers
    # whole logits and the ordinary cross-entropy unless the vocabulary-parallel head keeps its rank's logits
    cfg.tensor_parallel_output = bool(vocab_parallel and tensor_parallel_output and t > 1)
    model = model_cls(cfg)
    if weights_from is not None:
        load_checkpoint_into(model, weights_from)
    parallelize_model(model, group, sync_from_first_rank=sync_from_first_rank, vocab_parallel=vocab_parallel,
                      sequence_parallel=sequence_parallel)
    return model


# --- gathering -----------------------------------------------------------------------------------------------------

def _gather(x: paddle.Tensor, axis: int, group) -> paddle.Tensor:
    parts = []
    dist.all_gather(parts, x.contiguous(), group=group)
    return paddle.concat(parts, axis=axis)


def full_state(model, grads: bool = False) -> Dict[str, np.ndarray]:
    """Every parameter (or its gradient) as the single-device model holds it (in-memory layout), on every rank.

    Sharded tensors are all-gathered; whole ones are returned as held. Collective: call on every rank.
    """
    state = tp_state(model)
    out: Dict[str, np.ndarray] = {}
    for name, p in model.named_parameters():
        x = p.grad if grads else p
        if x is None:
            x = paddle.zeros_like(p)
        x = x.detach()
        shard = state.shard(name) if state is not None else TensorShard(None)
        if state is not None and state.t > 1 and shard.axis is not None:
            x = _gather(x, shard.axis, state.group)
        out[name] = x.astype("float64").numpy() if x.dtype != paddle.float64 else x.numpy()
    return out


def replica_divergence(model, grads: bool = False) -> float:
    """Largest |difference| between ranks of any whole (replicated) parameter or gradient; 0 means in sync."""
    state = tp_state(model)
    if state is None or state.t == 1:
        return 0.0
    worst = 0.0
    for name, p in model.named_parameters():
        if state.shard(name).axis is not None:
            continue
        x = p.grad if grads else p
        if x is None:
            continue
        parts = []
        dist.all_gather(parts, x.detach().contiguous(), group=state.group)
        for q in parts[1:]:
            worst = max(worst, float((q - parts[0]).abs().max()))
    return worst


def global_grad_norm(model) -> float:
    """The single-device global L2 norm of all gradients: sharded parts summed over ranks, whole ones once."""
    state = tp_state(model)
    local_sharded, whole = 0.0, 0.0
    for name, p in model.named_parameters():
        if p.grad is None:
            continue
        sq = float((p.grad.astype("float64") ** 2).sum())
        if state is not None and state.t > 1 and state.shard(name).axis is not None:
            local_sharded += sq
        else:
            whole += sq
    if state is not None and state.t > 1:
        buf = paddle.to_tensor([local_sharded], dtype="float64")
        dist.all_reduce(buf, group=state.group)
        local_sharded = float(buf.numpy()[0])
    return float(np.sqrt(local_sharded + whole))
