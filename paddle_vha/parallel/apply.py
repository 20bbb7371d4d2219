"""Apply the tensor-parallel plans to a built Qwen3-VHA or Qwen3-MEA model, from outside its math (torchtitan style).

    model = Qwen3VHAForCausalLM(config)             # single-device model, same seed on every rank
    parallelize_model(model, group)                 # now rank k holds its slices; forward/backward are TP

What changes, per decoder layer (the layer code itself is untouched and still reads as single-device math):

* parameters listed in plan.tensor_shards are replaced by this rank's slice (marked `is_distributed`), or kept
  whole with a gradient-summing hook (q_proj, q_norm, k_norm, and K/V/Premix when KV heads are replicated);
* the attention's head counts become the local ones, and its class becomes TensorParallelVHAAttention, which
  overrides only three steps: its input enters the TP region (`copy_to_tp`), Postmix becomes
  `Y_k + V_k allreduce(sum_k U_k^T Y_k)` (one all-reduce of R x d per token), and — when KV heads are
  replicated — the prologue reads the rank's Premix group from the whole Premix parameter; `o_proj` becomes
  row-parallel (all-reduce of h);
* the MLP's class becomes TensorParallelMLP (copy_to_tp on its input), down_proj row-parallel.

Qwen3-MEA layers (and the stock layers of an MEA model) take their rules from mea_plan.py and their attention
steps from mea_apply.py; the plan is chosen per decoder layer from its attention class.

All communication is the PyLayers of collectives.py on plain dist.all_reduce / all_gather (gloo and NCCL alike).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Dict, Optional

import numpy as np
import paddle
import paddle.distributed as dist
from paddle import nn
from paddle.nn import functional as F

from .collectives import (
    all_reduce_partial,
    allreduce_grad_hook,
    copy_to_tp,
    group_rank,
    group_size,
    reduce_from_tp,
)
from .plan import AttentionLayout, TensorShard, attention_layout, check_plan, tensor_shards

__all__ = [
    "TPState",
    "EntersTPRegion",
    "TensorParallelVHAAttention",
    "TensorParallelMLP",
    "RowParallelLinear",
    "ColumnSliceLinear",
    "build_tensor_parallel_model",
    "full_state",
    "global_grad_norm",
    "parallelize_model",
    "replica_divergence",
    "tp_state",
]

_LAYER = re.compile(r"^(.*layers\.(\d+)\.)(.+)$")


@dataclass
class TPState:
    """What parallelize_model did: size, rank, group and the shard of every parameter (by its name)."""

    t: int
    rank: int
    group: object
    shards: Dict[str, TensorShard]

    def shard(self, name: str) -> TensorShard:
        return self.shards.get(name, TensorShard(None))


def tp_state(model) -> Optional[TPState]:
    """The TPState of a parallelized model, or None for a single-device one."""
    return getattr(model, "_vha_tp_state", None)


# --- the three overridden steps ----------------------------------------------------------------------------------

class EntersTPRegion:
    """Mixin base: the layer's input enters the TP region. Every rank reads the whole x (identity forward); the
    gradient of x is the sum of the ranks' parts (all-reduce backward, `copy_to_tp`)."""

    _tp_group = None

    def forward(self, hidden_states, *args, **kwargs):  # the decoder layer passes the attention's input by this name
        return super().forward(copy_to_tp(hidden_states, self._tp_group), *args, **kwargs)


class TensorParallelVHAAttention(EntersTPRegion):
    """Mixin placed in front of the model's attention class: Qwen3VHAAttention math on this rank's heads."""

    _tp_premix_group = None  # KV replicated: the one Premix group (= KV head) this rank uses, else None

    def prologue(self, q_phys, k, cos, sin):
        if self._tp_premix_group is None:  # KV split: this rank's Premix parameter holds exactly its groups
            return super().prologue(q_phys, k, cos, sin)
        # KV replicated: Premix stays whole on every rank (summed gradient) and this rank uses group g only. The
        # inherited prologue (composed or fused) reads `self.vha_premix_weight`; for this call it reads the
        # differentiable slice [g:g+1] instead, so both paths see a consistent [1, r, d] with the rank's 1 KV head.
        g = self._tp_premix_group
        params = self._parameters
        whole = params["vha_premix_weight"]
        params["vha_premix_weight"] = whole[g:g + 1]
        try:
            return super().prologue(q_phys, k, cos, sin)
        finally:
            params["vha_premix_weight"] = whole

    def _postmix(self, y):
        # Y' = M Y with M = I + V U^T over all H_v heads; this rank holds heads k, rows U_k, V_k:
        #   Z = sum_k U_k^T Y_k   (R x d per token: the only exchange),   Y'_k = Y_k + V_k Z.
        z = paddle.matmul(self.vha_postmix_U, y, transpose_x=True)  # (B, S, R, d), this rank's part
        z = all_reduce_partial(z, self._tp_group)
        return y + paddle.matmul(self.vha_postmix_V, z)


class TensorParallelMLP(EntersTPRegion):
    """Mixin for the Qwen3 MLP: column-parallel gate/up (local), row-parallel down_proj (RowParallelLinear)."""


class RowParallelLinear(nn.Linear):
    """nn.Linear whose weight holds this rank's input rows: all-reduce of the partial products, then the bias."""

    _tp_group = None

    def forward(self, x):
        out = reduce_from_tp(F.linear(x, self.weight), self._tp_group)
        return out if self.bias is None else out + self.bias


class ColumnSliceLinear(nn.Linear):
    """nn.Linear with its whole (replicated) weight, computing only output columns [a, b) on this rank."""

    _tp_cols = (0, 0)

    def forward(self, x):
        a, b = self._tp_cols
        return F.linear(x, self.weight[:, a:b], None if self.bias is None else self.bias[a:b])


def make_row_parallel(linear, group) -> None:
    """Turn a Linear holding this rank's input rows into a RowParallelLinear over `group` (in place)."""
    linear.__class__ = RowParallelLinear
    linear._tp_group = group


def make_column_slice(linear, cols) -> None:
    """Let a Linear with a whole (replicated) weight compute only output columns cols = (a, b) (in place)."""
    linear.__class__ = ColumnSliceLinear
    linear._tp_cols = cols


_MIXED: Dict[tuple, type] = {}


def swap_class(layer, mixin):
    """Put `mixin` in front of the layer's class (one cached subclass per pair), so it overrides a few steps."""
    base = type(layer)
    if issubclass(base, mixin):
        return
    key = (mixin, base)
    if key not in _MIXED:
        _MIXED[key] = type(f"{mixin.__name__}[{base.__name__}]", (mixin, base), {})
    layer.__class__ = _MIXED[key]


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


def _owner(model, name: str):
    *path, attr = name.split(".")
    layer = model
    for part in path:
        layer = getattr(layer, part)
    return layer, attr


def _sync_from_first_rank(model, group):
    src = group.ranks[0] if group is not None else 0
    with paddle.no_grad():
        for _, p in model.named_parameters():
            dist.broadcast(p, src=src, group=group)


def parallelize_model(model, group=None, sync_from_first_rank: bool = True) -> TPState:
    """Shard a built Qwen3-VHA or Qwen3-MEA causal LM (or backbone) over `group` in place; returns its TPState.

    Build the model at tensor_model_parallel_size=1 on every rank first. With sync_from_first_rank (default) the
    whole model is broadcast from the group's first rank before slicing, so every rank starts from the same
    weights whatever its seed. Create the optimizer afterwards (the sharded parameters are new tensors).
    """
    if tp_state(model) is not None:
        raise RuntimeError("model is already tensor-parallel")
    config = model.config
    if getattr(config, "tensor_model_parallel_size", 1) > 1:
        raise RuntimeError("build the model at tensor_model_parallel_size=1 and let parallelize_model shard it "
                           "(see docs/tensor_parallel.md)")
    t, rank = group_size(group), group_rank(group)
    layers = _decoder_layers(model)
    others = sorted({type(layer.self_attn).__name__ for layer in layers if _attention_kind(layer.self_attn) is None})
    if others:
        raise TypeError("paddle_vha.parallel shards Qwen3-VHA and Qwen3-MEA attention only; this model has "
                        f"{', '.join(others)}")
    check_plan(config, t)
    plans = [_layer_plan(layer.self_attn, config, t, rank, i) for i, layer in enumerate(layers)]
    if t > 1 and sync_from_first_rank:
        _sync_from_first_rank(model, group)

    shards: Dict[str, TensorShard] = {}
    params = dict(model.named_parameters())
    for name, p in params.items():
        m = _LAYER.match(name)
        rule = plans[int(m.group(2))][1].get(m.group(3)) if m else None
        if rule is None or t == 1:
            continue
        owner, attr = _owner(model, name)
        if rule.axis is None:
            if rule.grad_sum:
                p.register_hook(allreduce_grad_hook(group))
            shards[name] = rule
            continue
        n = p.shape[rule.axis]
        if n % t:
            raise RuntimeError(f"{name}: size {n} along axis {rule.axis} is not divisible by t={t}")
        with paddle.no_grad():
            local = paddle.slice(p, [rule.axis], [rank * n // t], [(rank + 1) * n // t]).clone()
        _replace_param(owner, attr, local, distributed=True)
        shards[name] = rule

    if t > 1:
        for layer, (apply_attention, _) in zip(layers, plans):
            apply_attention(layer.self_attn, group)
            _parallelize_mlp(layer.mlp, group)
    state = TPState(t=t, rank=rank, group=group, shards=shards)
    model._vha_tp_state = state
    return state


def _attention_kind(attn) -> Optional[str]:
    """'vha', 'mea' (an MEA layer), 'stock' (a stock layer of an MEA model) or None (not shardable here)."""
    from ..attention import Qwen3VHAAttention
    from ..mea.attention import Qwen3MEAAttention, Qwen3StockKVAttention

    for cls, kind in ((Qwen3VHAAttention, "vha"), (Qwen3MEAAttention, "mea"), (Qwen3StockKVAttention, "stock")):
        if isinstance(attn, cls):
            return kind
    return None


def _layer_plan(attn, config, t: int, rank: int, layer_idx: int):
    """(apply(attn, group), {name relative to the decoder layer: TensorShard}) for one decoder layer."""
    kind = _attention_kind(attn)
    if kind == "vha":
        lay = attention_layout(config, t, rank)
        return (lambda a, g: _parallelize_attention(a, lay, config, g)), tensor_shards(config, t)
    from .mea_apply import parallelize_mea_attention, parallelize_stock_attention
    from .mea_plan import mea_layer_kind, mea_layer_layout, mea_layer_shards

    assert mea_layer_kind(config, layer_idx) == kind, f"layer {layer_idx}: {kind} attention, config says otherwise"
    lay = mea_layer_layout(config, t, rank, layer_idx)
    apply = parallelize_mea_attention if kind == "mea" else parallelize_stock_attention
    return (lambda a, g: apply(a, lay, g)), mea_layer_shards(config, t, layer_idx)


def _decoder_layers(model):
    base = model.model if hasattr(model, "model") and hasattr(model.model, "layers") else model
    return list(base.layers)


def _parallelize_attention(attn, lay: AttentionLayout, config, group):
    d = config.head_dim
    attn.num_heads = lay.num_heads
    attn.num_key_value_heads = lay.num_kv_heads
    attn.num_key_value_groups = lay.num_heads // lay.num_kv_heads
    attn.num_physical_heads = lay.num_physical
    r = attn.q_head_dim
    if not lay.kv_sharded:
        # K/V and Premix stay whole; this rank computes its KV head and its physical heads only.
        for proj, cols in ((attn.q_proj, (lay.physical[0] * r, lay.physical[1] * r)),
                           (attn.k_proj, (lay.groups[0] * d, lay.groups[1] * d)),
                           (attn.v_proj, (lay.groups[0] * d, lay.groups[1] * d))):
            make_column_slice(proj, cols)
        attn._tp_premix_group = lay.groups[0]
    make_row_parallel(attn.o_proj, group)
    swap_class(attn, TensorParallelVHAAttention)
    attn._tp_group = group


def _parallelize_mlp(mlp, group):
    if getattr(mlp, "fuse_up_gate", False):
        raise RuntimeError("fused up|gate MLP is not supported by the tensor-parallel plan")
    make_row_parallel(mlp.down_proj, group)
    swap_class(mlp, TensorParallelMLP)
    mlp._tp_group = group


def build_tensor_parallel_model(model_cls, config, group=None, sync_from_first_rank: bool = True,
                                weights_from: Optional[str] = None):
    """The entry point for trainers: build `model_cls(config)` single-device, then shard it over `group`.

    `config.tensor_model_parallel_size` may say t (as PaddleFormers' Trainer sets it); the model is built with a
    copy at 1 (the plan, not fleet's layers, does the sharding) and must equal the group size. `weights_from`: a
    checkpoint folder (the single-device contract, e.g. tools/compress_kv.py's output or a merged TP save) whose
    weights every rank loads before slicing (paddle_vha.weights: no PaddleFormers loader inside the ranks).
    """
    import copy

    t = group_size(group)
    want = getattr(config, "tensor_model_parallel_size", 1)
    if want not in (1, t):
        raise RuntimeError(f"config.tensor_model_parallel_size={want} but the tensor-parallel group has {t} ranks")
    config.check_runtime_support(tensor_parallel_plan=True)  # sequence parallel, fused qkv: still refused
    cfg = copy.deepcopy(config)
    cfg.tensor_model_parallel_size = 1
    cfg.tensor_parallel_output = False  # the LM head is replicated: full logits, ordinary cross-entropy
    model = model_cls(cfg)
    if weights_from is not None:
        from ..weights import load_checkpoint_into

        load_checkpoint_into(model, weights_from)
    parallelize_model(model, group, sync_from_first_rank=sync_from_first_rank)
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
