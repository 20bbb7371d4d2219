"""Vocabulary parallelism inside pipeline stages (PP x TP): the first stage's embedding and the last stage's LM head
and cross-entropy split by vocabulary row over the stage's tensor-parallel group, with vocab.py's parts.

A pipe model (paddle_vha/modeling/pipe.py, PaddleFormers' `GeneralModelForCausalLMPipe`) holds on each stage only
the layers fleet's `PipelineLayer` gave it: the first stage an `EmbeddingPipe` (its `embed_tokens`), the last an
`LMHeadPipe` (an `LMHead` taking the pipe's argument tuple) and, on every stage, the criterion (`_loss_fn[0]`, used
on the last). Their parameters are named by the stage layer's place in the pipe's sequence (`0.embed_tokens.weight`,
`3.weight`) or, with a tied head, `shared_layers.model_shared_weight.*`; fleet then all-reduces the tied weight's
gradient between the first and last stage ranks of the same tensor-parallel rank, which hold the same vocabulary
rows, so the tied head needs nothing more here (tools/train.py still refuses tied + PP + the split: tied PP is off
under gradient clipping, split or not; docs/training.md, "Parallel layouts").

* embedding: `embed_tokens` replaced by vocab.VocabParallelEmbedding (the `EmbeddingPipe` calls it as before);
* head: the `LMHeadPipe`'s forward replaced on the instance by vocab.VocabParallelLMHead's over the same (sliced)
  parameters, after the pipe's argument parsing (the layer object, its name and the stage's layer list unchanged);
* criterion: vocab.VocabParallelCrossEntropy with `enable_parallel_cross_entropy`, as apply_vocab_plan sets it.
"""
from __future__ import annotations

from types import SimpleNamespace
from typing import Dict, Optional, Tuple

from ..spec.sharding import TPPlanError
from .collectives import group_rank, group_size
from .vocab import VOCAB_SHARD, VocabParallelCrossEntropy, VocabParallelEmbedding, VocabParallelLMHead

__all__ = ["is_pipe_stage", "pipe_vocab_params", "apply_pipe_vocab_plan"]


def is_pipe_stage(model) -> bool:
    """Whether `model` is one stage of fleet's PipelineLayer (a pipe model), not a plain causal LM."""
    from paddle.distributed.fleet.meta_parallel import PipelineLayer

    return isinstance(model, PipelineLayer)


def _stage_vocab_layers(model) -> Tuple[Optional[Tuple[str, object]], Optional[Tuple[str, object]]]:
    """((name prefix, the EmbeddingPipe) or None, (name prefix, the LM head layer) or None) of this stage."""
    from paddleformers.nn.lm_head import LMHead

    embedding = head = None
    for name, layer in model.named_sublayers():
        if embedding is None and hasattr(layer, "embed_tokens") and hasattr(layer, "rotary_emb"):
            embedding = (f"{name}.", layer)
        if head is None and isinstance(layer, LMHead):
            head = (f"{name}.", layer)
    return embedding, head


def pipe_vocab_params(model) -> Dict[str, object]:
    """{parameter name: VOCAB_SHARD} of this stage's embedding and LM head (weight, bias), by the stage's names."""
    embedding, head = _stage_vocab_layers(model)
    out = {}
    if embedding is not None:
        out[f"{embedding[0]}embed_tokens.weight"] = VOCAB_SHARD
    if head is not None:
        out[f"{head[0]}weight"] = VOCAB_SHARD
        if getattr(head[1], "bias", None) is not None:
            out[f"{head[0]}bias"] = VOCAB_SHARD
    if embedding is not None and head is not None and head[1].weight is embedding[1].embed_tokens.weight:
        raise TPPlanError("vocab_parallel: a pipeline stage holding both the embedding and its tied head is not "
                          "built; use more than one stage, or tools/train.py --vocab_parallel false")
    return out


def _parallel_head_forward(vocab_head):
    """The LMHeadPipe's forward with the vocabulary-parallel head: the pipe's arguments parsed as LMHeadPipe does."""
    from paddleformers.nn.pp_model import parse_args

    def forward(args):
        hidden_states = parse_args(args)[0]
        return vocab_head(hidden_states)

    return forward


def apply_pipe_vocab_plan(model, group, tensor_parallel_output: bool) -> None:
    """Install the vocabulary-parallel embedding / head / criterion on this stage, whose vocabulary parameters are
    already this rank's rows (parallelize_model slices them by pipe_vocab_params' names)."""
    t, rank = group_size(group), group_rank(group)
    vocab = model.config.vocab_size
    start = rank * (vocab // t)
    embedding, head = _stage_vocab_layers(model)
    if embedding is not None:
        owner = embedding[1]
        owner.embed_tokens = VocabParallelEmbedding(owner.embed_tokens.weight, group, start, vocab)
    if head is None:
        return
    config = SimpleNamespace(tensor_parallel_output=tensor_parallel_output)  # all VocabParallelLMHead reads
    vocab_head = VocabParallelLMHead(head[1], group, config)  # holds the head's parameters; not a sublayer
    head[1].forward = _parallel_head_forward(vocab_head)
    if tensor_parallel_output:
        for criterion in model._loss_fn:
            criterion.enable_parallel_cross_entropy = True  # the criterion checks the logits are split
            criterion.loss_func = VocabParallelCrossEntropy(group, start, getattr(criterion, "ignored_index", -100))
