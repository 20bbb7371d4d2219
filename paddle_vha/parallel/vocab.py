"""Vocabulary parallelism: the embedding split by vocabulary rows, the LM head by vocabulary rows of its [V, h]
weight (the logits' vocabulary columns), and the cross-entropy over the split logits (Megatron's vocab-parallel
embedding and parallel cross-entropy; fleet's VocabParallelEmbedding, ColumnParallelLinear(gather_output=False) and
ParallelCrossEntropy).

Rank k of t holds vocabulary rows [k·V/t, (k+1)·V/t) of `embed_tokens.weight` and of `lm_head.weight` (and bias); a
tied head stays the same parameter as the embedding. What runs where (docs/tensor_parallel.md, "Vocabulary
parallelism"):

    step                     GPU (any non-CPU place): fleet's own ops,       CPU (gloo): the narrowest equivalent
                             called as fleet's layers call them
    embedding lookup         mp_ops._c_lookup_table (c_embedding)            the same op (it has a CPU kernel); in
                                                                             float64 a masked F.embedding (its CPU
                                                                             gradient is wrong there, start_index > 0)
    embedding sum            mp_ops._mp_allreduce                            collectives.reduce_from_tp
    head input               mp_ops._c_identity                              collectives.copy_to_tp
    whole logits (optional)  mp_ops._c_concat                                collectives.gather_from_tp
    cross-entropy            mp_ops._c_softmax_with_cross_entropy            VocabParallelCrossEntropy's PyLayer:
                                                                             max, sum-exp and target-logit all-reduces

On CPU, Paddle 3.3.1 refuses fleet's: "ProcessGroupGLOO does not support all_reduce with sync_op and use_calc_stream
flag" (_mp_allreduce), "Do not support c_identity / c_concat / c_softmax_with_cross_entropy for cpu kernel now".

`config.tensor_parallel_output` (PaddleFormers' switch) says what the head returns: True, this rank's [.., V/t]
logits and the criterion computes the parallel cross-entropy; False, the whole [.., V] logits on every rank
(all-gathered) and the criterion's ordinary cross-entropy.
"""
from __future__ import annotations

from typing import Dict

import paddle
import paddle.distributed as dist
from paddle import nn
from paddle.autograd import PyLayer

from ..spec.sharding import TensorShard, TPPlanError
from .collectives import copy_to_tp, gather_from_tp, group_rank, group_size, reduce_from_tp

__all__ = ["VOCAB_SHARD", "VocabParallelEmbedding", "VocabParallelLMHead", "VocabParallelCrossEntropy",
           "check_vocab_split", "fleet_ops_here", "vocab_params", "apply_vocab_plan"]

VOCAB_SHARD = TensorShard(0)  # embedding [V, h], LM head weight [V, h] and bias [V]: split by vocabulary row


def fleet_ops_here() -> bool:
    """Whether fleet's mp ops run here: on every device but the CPU (where they have no kernel / gloo support)."""
    return not paddle.get_device().startswith("cpu")


def _mp_ops():
    from paddle.distributed.fleet.layers.mpu import mp_ops

    return mp_ops


def check_vocab_split(vocab_size: int, t: int) -> None:
    """TPPlanError (one line) unless the vocabulary splits into t equal parts (refused, not padded)."""
    if vocab_size % t:
        raise TPPlanError(f"vocab_size={vocab_size} is not divisible by the tensor-parallel size t={t}: the "
                          f"vocabulary-parallel embedding and LM head split it into t equal parts (pad the vocabulary "
                          f"to a multiple of {t}, or keep them whole: tools/train.py --vocab_parallel false)")


def _masked_lookup(weight, ids, start: int):
    """c_embedding's math with F.embedding: rows [start, start + n) looked up, zeros for ids outside. Used for float64
    on CPU, where Paddle 3.3.1's c_embedding gradient is wrong once start_index > 0 (float32 is exact)."""
    local = ids - start
    mine = paddle.logical_and(local >= 0, local < weight.shape[0])
    rows = nn.functional.embedding(paddle.where(mine, local, paddle.zeros_like(local)), weight)  # [.., h]
    return rows * mine.astype(weight.dtype).unsqueeze(-1)


class VocabParallelEmbedding(nn.Layer):
    """An embedding holding vocabulary rows [start, start + V/t): rows outside read zeros, one all-reduce sums."""

    def __init__(self, weight, group, start: int, vocab_size: int):
        super().__init__()
        self.weight, self._tp_group, self._start, self._vocab = weight, group, start, vocab_size

    def forward(self, ids):
        mp_ops = _mp_ops()
        if self.weight.dtype == paddle.float64 and not fleet_ops_here():
            part = _masked_lookup(self.weight, ids, self._start)
        else:
            part = mp_ops._c_lookup_table(self.weight, ids, start_index=self._start, vocab_size=self._vocab)
        if fleet_ops_here():
            return mp_ops._mp_allreduce(part, group=self._tp_group, use_calc_stream=True, use_model_parallel=True)
        return reduce_from_tp(part, self._tp_group)


class VocabParallelLMHead(nn.Layer):
    """PaddleFormers' LMHead ([V, h] weight, logits = h · Wᵀ) over this rank's vocabulary rows."""

    def __init__(self, head, group, config):
        super().__init__()
        self.weight, self.bias, self._tp_group, self.config = head.weight, head.bias, group, config

    def forward(self, hidden_states, tensor_parallel_output=None):
        if tensor_parallel_output is None:
            tensor_parallel_output = self.config.tensor_parallel_output
        fleet = fleet_ops_here()
        x = _mp_ops()._c_identity(hidden_states, group=self._tp_group) if fleet else copy_to_tp(hidden_states,
                                                                                               self._tp_group)
        logits = paddle.matmul(x, self.weight, transpose_y=True)  # [.., V/t]
        if self.bias is not None:
            logits = logits + self.bias
        if tensor_parallel_output:
            return logits
        return _mp_ops()._c_concat(logits, group=self._tp_group) if fleet else gather_from_tp(logits, self._tp_group)


class _ParallelSoftmaxCE(PyLayer):
    """Cross-entropy over logits split along the last axis (rank part [.., n] holds classes [start, start + n)):
    log Σ_all exp(z) - z_label from a max, a sum-exp and a target-logit all-reduce; 0 where label == ignore_index."""

    @staticmethod
    def forward(ctx, logits, label, group, start, ignore_index):
        n = logits.shape[-1]
        m = logits.max(axis=-1, keepdim=True)
        dist.all_reduce(m, op=dist.ReduceOp.MAX, group=group)
        e = paddle.exp(logits - m)  # [.., n]
        s = e.sum(axis=-1, keepdim=True)
        dist.all_reduce(s, op=dist.ReduceOp.SUM, group=group)
        local = label.astype("int64") - start  # [.., 1]
        mine = paddle.logical_and(local >= 0, local < n)
        idx = paddle.where(mine, local, paddle.zeros_like(local))
        target = paddle.take_along_axis(logits - m, idx, axis=-1) * mine.astype(logits.dtype)
        dist.all_reduce(target, op=dist.ReduceOp.SUM, group=group)
        keep = (label != ignore_index).astype(logits.dtype)
        ctx.save_for_backward(e / s, idx, mine.astype(logits.dtype), keep)
        return (paddle.log(s) - target) * keep  # [.., 1]

    @staticmethod
    def backward(ctx, dloss):
        p, idx, mine, keep = ctx.saved_tensor()
        grad = paddle.put_along_axis(p, idx, -mine, axis=-1, reduce="add")  # softmax - one-hot (this rank's part)
        return grad * (dloss * keep), None


class VocabParallelCrossEntropy(nn.Layer):
    """fleet's ParallelCrossEntropy (GPU) or the same math on plain all-reduces (CPU): per-token loss [.., 1]."""

    def __init__(self, group, start: int, ignore_index: int = -100):
        super().__init__()
        self._tp_group, self._start, self.ignore_index = group, start, ignore_index

    def forward(self, logits, label):
        if fleet_ops_here():
            return _mp_ops()._c_softmax_with_cross_entropy(logits, label, group=self._tp_group,
                                                           ignore_index=self.ignore_index)
        return _ParallelSoftmaxCE.apply(logits, label, self._tp_group, self._start, self.ignore_index)


def _embedding_owner(model):
    """(name prefix, the layer holding embed_tokens) of a causal LM or a backbone, else (None, None)."""
    if hasattr(model, "model") and hasattr(model.model, "embed_tokens"):
        return "model.", model.model
    if hasattr(model, "embed_tokens"):
        return "", model
    return None, None


def vocab_params(model) -> Dict[str, TensorShard]:
    """{parameter name: VOCAB_SHARD} of the model's embedding and (untied) LM head, as named_parameters names them."""
    prefix, owner = _embedding_owner(model)
    if owner is None:
        raise TPPlanError(f"{type(model).__name__} has no embed_tokens: vocabulary parallelism needs one")
    out = {f"{prefix}embed_tokens.weight": VOCAB_SHARD}
    head = getattr(model, "lm_head", None)
    if head is not None and head.weight is not owner.embed_tokens.weight:
        out["lm_head.weight"] = VOCAB_SHARD
    if head is not None and getattr(head, "bias", None) is not None:
        out["lm_head.bias"] = VOCAB_SHARD
    return out


def apply_vocab_plan(model, group, tied: bool) -> Dict[str, str]:
    """Install the vocabulary-parallel embedding, head and criterion on a model whose vocabulary parameters are
    already this rank's rows (parallelize_model slices them). `tied`: the head was the embedding's parameter before
    slicing; it is re-tied to the sliced one. Returns {alias name: parameter name} of the tied head ({} if untied)."""
    t, rank = group_size(group), group_rank(group)
    prefix, owner = _embedding_owner(model)
    vocab = owner.embed_tokens.weight.shape[0] * t
    start = rank * (vocab // t)
    owner.embed_tokens = VocabParallelEmbedding(owner.embed_tokens.weight, group, start, vocab)
    head = getattr(model, "lm_head", None)
    if head is None:
        return {}
    if tied:
        head.weight = owner.embed_tokens.weight
    model.lm_head = VocabParallelLMHead(head, group, model.config)
    criterion = getattr(model, "criterion", None)
    if criterion is not None and model.config.tensor_parallel_output:
        criterion.enable_parallel_cross_entropy = True  # PaddleFormers' criterion checks the logits are split
        criterion.loss_func = VocabParallelCrossEntropy(group, start, getattr(criterion, "ignored_index", -100))
    return {"lm_head.weight": f"{prefix}embed_tokens.weight"} if tied else {}

