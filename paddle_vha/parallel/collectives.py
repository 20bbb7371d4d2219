"""Autograd-aware tensor-parallel collectives built on plain `dist.all_reduce` / `dist.all_gather`.

Fleet's mp operators (`c_identity`, RowParallelLinear's calc-stream all-reduce) have no CPU / gloo kernels;
these PyLayers use only the public collectives, so the same code runs on gloo (CPU) and NCCL (GPU). Each
names its forward and backward communication, because which one is right depends on whether the code
downstream of it is replicated (same on every rank) or rank-specific:

    copy_to_tp          forward identity       backward all-reduce   Megatron's "f": the input of a column-
                                                                     parallel region (replicated -> rank-specific)
    reduce_from_tp      forward all-reduce     backward identity     Megatron's "g": the output of a row-parallel
                                                                     region (rank-specific -> replicated)
    all_reduce_partial  forward all-reduce     backward all-reduce   a sum of rank-specific partials consumed
                                                                     rank-specifically (VHA's Postmix Z = sum_r U_r^T Y_r)
    gather_from_tp      forward all-gather     backward slice        rank-specific last-axis parts -> the whole
                        (last axis)                                  tensor on every rank (vocab-parallel logits)
    allreduce_grad_hook a parameter-gradient hook: sums the gradient of a replicated parameter that each rank uses
                        only partly (q_proj, q_norm, ...) so the replicas stay identical

`group` is a `paddle.distributed` communication group (None: the default, all ranks).
"""
from __future__ import annotations

import paddle
import paddle.distributed as dist
from paddle.autograd import PyLayer

__all__ = [
    "all_reduce_partial",
    "allreduce_grad_hook",
    "copy_to_tp",
    "gather_from_tp",
    "group_rank",
    "group_size",
    "reduce_from_tp",
]


def group_size(group=None) -> int:
    return group.nranks if group is not None else dist.get_world_size()


def group_rank(group=None) -> int:
    return group.rank if group is not None else dist.get_rank()


def _all_reduce(x: paddle.Tensor, group) -> paddle.Tensor:
    out = x.clone()
    dist.all_reduce(out, op=dist.ReduceOp.SUM, group=group)
    return out


class _CopyToTP(PyLayer):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.clone()

    @staticmethod
    def backward(ctx, dy):
        return _all_reduce(dy, ctx.group)


class _ReduceFromTP(PyLayer):
    @staticmethod
    def forward(ctx, x, group):
        return _all_reduce(x, group)

    @staticmethod
    def backward(ctx, dy):
        return dy.clone()


class _AllReducePartial(PyLayer):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _all_reduce(x, group)

    @staticmethod
    def backward(ctx, dy):
        return _all_reduce(dy, ctx.group)


class _GatherFromTP(PyLayer):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group, ctx.n = group, x.shape[-1]
        parts = []
        dist.all_gather(parts, x.contiguous(), group=group)
        return paddle.concat(parts, axis=-1)  # [..., t * n]: rank k's part at [k*n, (k+1)*n)

    @staticmethod
    def backward(ctx, dy):
        k, n = group_rank(ctx.group), ctx.n
        return paddle.slice(dy, [dy.ndim - 1], [k * n], [(k + 1) * n]).clone()


def copy_to_tp(x: paddle.Tensor, group=None) -> paddle.Tensor:
    """Identity forward; all-reduce of the gradient backward (enter a rank-specific region)."""
    return _CopyToTP.apply(x, group)


def reduce_from_tp(x: paddle.Tensor, group=None) -> paddle.Tensor:
    """All-reduce (sum) forward; identity backward (leave a rank-specific region; downstream is replicated)."""
    return _ReduceFromTP.apply(x, group)


def all_reduce_partial(x: paddle.Tensor, group=None) -> paddle.Tensor:
    """All-reduce (sum) forward and backward: partial sums whose total every rank consumes in its own way."""
    return _AllReducePartial.apply(x, group)


def gather_from_tp(x: paddle.Tensor, group=None) -> paddle.Tensor:
    """All-gather along the last axis forward; this rank's slice of the gradient backward (the consumer of the whole
    tensor is replicated, so every rank's dy is the same and its own part is the gradient of its input)."""
    return _GatherFromTP.apply(x, group)


def allreduce_grad_hook(group=None):
    """A gradient hook (`param.register_hook(...)`) summing the gradient over the group.

    For a parameter replicated on every rank but used by each rank for its own heads only: each rank's gradient
    is a partial sum, and the sum is the single-device gradient, identical on every rank afterwards.
    """

    def hook(grad):
        # in place, returning nothing: a hook registered after this one (PaddleFormers' master-grad hook, which
        # moves the gradient into an fp32 main_grad and clears it) then sees, and clears, the summed tensor itself
        dist.all_reduce(grad, op=dist.ReduceOp.SUM, group=group)

    return hook
