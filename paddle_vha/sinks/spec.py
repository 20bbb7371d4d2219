"""The attention-sink tensor, declared once: `self_attn.sinks` [H], one learned logit s_h per query head of a
sliding-window layer (upstream PaddleFleet's `core_attention.softmax_offset`; Hugging Face's GPT-OSS name `sinks`),
and the tensors of Qwen3 with sinks (stock Qwen3's layer plus that tensor on window layers).

The softmax of head h over keys t gains exp(s_h) in its denominator and no value (docs/method.md, "Attention sinks").
Tensor parallelism: split by query head as the heads are (TensorShard(0): rank k holds the logits of its heads).
Fold: a virtual head is a folded head, so the tensor is copied as it is. Serving: a graph constant of the layer's
form (`serve="sinks"`: the exported softmax's extra column).
"""
from __future__ import annotations

from types import SimpleNamespace

from ..qwen3.spec import QWEN3_LAYER, TOP, stock_sizes, top_sizes
from ..spec.params import ModelSpec, Param, TensorShard

__all__ = ["SINKS", "sinks_param", "init_sinks", "SINKS_LAYER", "QWEN3_SINKS", "tensor_shapes"]

SINKS = "self_attn.sinks"


def init_sinks(s, cfg):
    """N(0, initializer_range), as upstream's init_method initialises softmax_offset."""
    from paddle import nn

    return nn.initializer.Normal(0.0, float(getattr(cfg, "initializer_range", 0.02)))


def sinks_param(heads=lambda s: s.heads, when=lambda s: s.sinks) -> Param:
    """The sink logits of a layer with `heads(sizes)` query heads, present where `when(sizes)` holds."""
    return Param(SINKS, lambda s: (heads(s),), TensorShard(0), init=init_sinks, when=when, serve="sinks")


def sinks_sizes(cfg, layer_idx: int) -> SimpleNamespace:
    """Stock sizes plus whether layer `layer_idx` has sinks."""
    s = stock_sizes(cfg, layer_idx)
    s.sinks = bool(getattr(cfg, "has_sinks", lambda i: False)(layer_idx))
    return s


SINKS_LAYER = QWEN3_LAYER.replace("qwen3_sinks", sizes=sinks_sizes, add=(sinks_param(),))
QWEN3_SINKS = ModelSpec(top=TOP, top_sizes=top_sizes, layer=lambda cfg, i: SINKS_LAYER)
tensor_shapes = QWEN3_SINKS.tensor_shapes  # the on-disk contract: name -> HF-layout shape
