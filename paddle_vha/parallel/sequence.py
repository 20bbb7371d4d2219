"""Sequence parallelism on top of the tensor-parallel plan (Megatron's; fleet's sequence_parallel_utils), applied
from outside the model like the rest of the plan (docs/tensor_parallel.md, "Sequence parallelism").

Between the TP regions (the residual stream, the layer norms, the final norm) rank k of t holds tokens
[k·s/t, (k+1)·s/t) of every sequence instead of all s, so those activations take 1/t of the memory:

    where                                  without sequence parallelism      with it
    first decoder layer's input            whole sequence                    scatter_seq    (fwd slice, bwd all-gather)
    attention / MLP input (enter region)   copy_to_tp                        all_gather_seq (fwd all-gather,
                                                                                             bwd reduce-scatter)
    o_proj / down_proj output              reduce_from_tp (all-reduce)       reduce_scatter_seq (fwd reduce-scatter,
                                                                                                 bwd all-gather)
    final norm's output (before the head)  whole sequence                    gather_seq     (fwd all-gather, bwd slice)

The weights used on the rank's tokens only (input_layernorm, post_attention_layernorm, the final norm, o_proj's /
down_proj's bias) get partial gradients: the plan sums them with its gradient-summing hook (`sp_grad_sum_names`).

What runs where. The model's layout is [b, s, h] (sequence on axis 1); fleet's ops split axis 0 ([s, b, h]):

    step                GPU (a non-CPU place, over fleet's model-parallel group): fleet's ops on [s, b, h]
                        (transposed in and out)
    scatter_seq         ScatterOp
    gather_seq          GatherOp
    all_gather_seq      AllGatherOp
    reduce_scatter_seq  ReduceScatterOp

    CPU (gloo), the PyLayers below: a slice, dist.all_gather, and - gloo has no reduce_scatter ("ProcessGroupGLOO
    does not support reduce_scatter with sync_op flag", which also fails AllGatherOp's backward) - a reduce-scatter
    as an all-reduce followed by this rank's slice (t times the traffic of a real reduce-scatter; the same sums).
"""
from __future__ import annotations

import paddle
import paddle.distributed as dist
from paddle.autograd import PyLayer

from ..spec.sharding import REPLICATED_SUMMED, LayerPlan, TensorShard, TPPlanError
from .collectives import group_rank, group_size

__all__ = ["all_gather_seq", "check_sequence_split", "gather_seq", "reduce_scatter_seq", "scatter_seq",
           "sp_grad_sum_rule", "install_sequence_hooks"]

SEQ_AXIS = 1  # [b, s, h]


def check_sequence_split(seq_len: int, t: int) -> None:
    """TPPlanError (one line) unless every sequence splits into t equal parts."""
    if seq_len % t:
        raise TPPlanError(f"sequence length {seq_len} is not divisible by the tensor-parallel size t={t}: sequence "
                          f"parallelism gives each rank s/t tokens (use a max_seq_len that is a multiple of {t}, or "
                          f"sequence_parallel false)")


def _own(x, group):
    """This rank's part of x along the sequence axis."""
    t, k = group_size(group), group_rank(group)
    check_sequence_split(x.shape[SEQ_AXIS], t)
    n = x.shape[SEQ_AXIS] // t
    return paddle.slice(x, [SEQ_AXIS], [k * n], [(k + 1) * n]).clone()


def _all_gather(x, group):
    parts = []
    dist.all_gather(parts, x.contiguous(), group=group)
    return paddle.concat(parts, axis=SEQ_AXIS)  # [b, t·n, h]: rank k's tokens at [k·n, (k+1)·n)


def _reduce_scatter(x, group):
    """gloo has no reduce_scatter: the sum over ranks (all-reduce), then this rank's tokens."""
    out = x.clone()
    dist.all_reduce(out, op=dist.ReduceOp.SUM, group=group)
    return _own(out, group)


def _collective(name: str, forward, backward) -> type:
    """A PyLayer running forward(x, group) and, for the gradient, backward(dy, group)."""

    def fwd(ctx, x, group):
        ctx.group = group
        return forward(x, group)

    return type(name, (PyLayer,), {"forward": staticmethod(fwd),
                                   "backward": staticmethod(lambda ctx, dy: backward(dy, ctx.group))})


_Scatter = _collective("_Scatter", _own, _all_gather)
_Gather = _collective("_Gather", _all_gather, _own)
_AllGather = _collective("_AllGather", _all_gather, _reduce_scatter)
_ReduceScatter = _collective("_ReduceScatter", _reduce_scatter, _all_gather)


_FLEET = {_Scatter: "ScatterOp", _Gather: "GatherOp", _AllGather: "AllGatherOp", _ReduceScatter: "ReduceScatterOp"}


def _fleet_group_is(group) -> bool:
    """Whether `group` is fleet's model-parallel group (the one fleet's sequence-parallel ops communicate over)."""
    from paddle.distributed import fleet

    try:
        hcg = fleet.get_hybrid_communicate_group()  # None (or an error) before fleet.init
    except Exception:  # noqa: BLE001 - no hybrid topology: the plan's own collectives
        return False
    if hcg is None:
        return False
    mp = hcg.get_model_parallel_group()
    return group is mp or (group is not None and list(group.ranks) == list(mp.ranks))


def _apply(op, x, group):
    if not paddle.get_device().startswith("cpu") and _fleet_group_is(group):
        from paddle.distributed.fleet.utils import sequence_parallel_utils as spu

        if op in (_Scatter, _ReduceScatter):  # one line, before fleet's assertion
            check_sequence_split(x.shape[SEQ_AXIS], group_size(group))
        # [b, s, h] -> [s, b, h] and back; contiguous: Paddle's collectives refuse a strided tensor
        y = getattr(spu, _FLEET[op]).apply(paddle.transpose(x, [1, 0, 2]).contiguous())
        return paddle.transpose(y, [1, 0, 2])
    return op.apply(x, group)


def scatter_seq(x, group=None):
    """[b, s, h] -> this rank's [b, s/t, h] (backward: all-gather). Enter the sequence-parallel stream."""
    return _apply(_Scatter, x, group)


def gather_seq(x, group=None):
    """[b, s/t, h] -> [b, s, h] for a replicated consumer (backward: this rank's slice). Leave the stream."""
    return _apply(_Gather, x, group)


def all_gather_seq(x, group=None):
    """[b, s/t, h] -> [b, s, h] for a rank-specific consumer (a TP region; backward: reduce-scatter)."""
    return _apply(_AllGather, x, group)


def reduce_scatter_seq(x, group=None):
    """Partial [b, s, h] sums -> this rank's tokens of the sum, [b, s/t, h] (backward: all-gather)."""
    return _apply(_ReduceScatter, x, group)


def sp_grad_sum_rule(name: str, where, rule, plan: LayerPlan, vocab_names) -> TensorShard:
    """The shard of parameter `name` under sequence parallelism: a whole weight used on the rank's tokens only (a
    decoder layer's outside its TP regions, a row-parallel Linear's bias, the final norm) gets its gradient summed;
    everything else keeps `rule`. `where`: (layer index, name inside the layer) or None; vocab_names: the embedding's
    and head's names (used on whole sequences: their gradients are complete)."""
    if rule is not None and (rule.axis is not None or rule.grad_sum):
        return rule
    if where is None:
        return rule if name in vocab_names else REPLICATED_SUMMED
    inner = where[1]
    in_region = any(inner.startswith(p + ".") for p in plan.enter_region)
    row_bias = any(inner == f"{p}.bias" for p in plan.row_parallel)
    return REPLICATED_SUMMED if row_bias or not in_region else rule


def install_sequence_hooks(first_layer, final_norm, group) -> None:
    """The first decoder layer's input is scattered along the sequence, the final norm's output gathered."""

    def scatter_input(layer, args, kwargs):
        if "hidden_states" in kwargs:
            return args, dict(kwargs, hidden_states=scatter_seq(kwargs["hidden_states"], group))
        return (scatter_seq(args[0], group),) + tuple(args[1:]), kwargs

    first_layer.register_forward_pre_hook(scatter_input, with_kwargs=True)
    final_norm.register_forward_post_hook(lambda layer, inputs, out: gather_seq(out, group))
