"""Qwen3-VHA models: PaddleFormers' Qwen3 classes with Qwen3VHAAttention in every layer (paddle_vha/modeling/factory.py).

Deviations from the parent classes, beyond the attention: positions continue a filled cache (stock Qwen3Model
restarts them at 0), and window layers with their own head width or RoPE base read their own RoPE tables. The on-disk
layout is declared in paddle_vha/vha/spec.py (docs/checkpoint.md), checked before every load.
"""
from __future__ import annotations

from ..modeling.factory import Variant, build_family
from ..qwen3.base import QWEN3_BASE
from ..qwen3.modeling import CacheContinuingPositionsMixin, LayerwiseRotaryEmbedding
from .attention import Qwen3VHAAttention
from .config import Qwen3VHAConfig
from .spec import QWEN3_VHA

__all__ = ["Qwen3VHADecoderLayer", "Qwen3VHAModel", "Qwen3VHAForCausalLM", "Qwen3VHAPretrainedModel",
           "Qwen3VHAForCausalLMPipe"]


def _rotary(config: Qwen3VHAConfig):
    """Qwen3's rotary embedding plus one per other (head_dim, rope_theta) of the window layers; None if there is none."""
    full = config.full_dims()
    others = {(dims.head_dim, float(dims.rope_theta)) for dims in map(config.layer_dims, config.window_layers())}
    others.discard((full.head_dim, float(full.rope_theta)))
    return LayerwiseRotaryEmbedding(config, sorted(others)) if others else None


(Qwen3VHADecoderLayer, Qwen3VHAPretrainedModel, Qwen3VHAModel, Qwen3VHAForCausalLM,
 Qwen3VHAForCausalLMPipe) = build_family(QWEN3_BASE, Variant(
    prefix="Qwen3VHA", label="Qwen3-VHA", config_class=Qwen3VHAConfig, spec=QWEN3_VHA, module=__name__,
    attention=lambda config, layer_idx: Qwen3VHAAttention,
    model_mixins=(CacheContinuingPositionsMixin,), rotary=_rotary))
