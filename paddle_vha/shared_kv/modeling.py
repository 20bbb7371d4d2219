"""Qwen3 shared-KV models: PaddleFormers' Qwen3 classes with Qwen3SharedKVAttention in every layer
(paddle_vha/modeling/factory.py); positions continue a filled cache (stock Qwen3Model restarts them at 0)."""
from __future__ import annotations

from ..modeling.factory import Variant, build_family
from ..qwen3.base import QWEN3_BASE
from ..qwen3.modeling import CacheContinuingPositionsMixin
from .attention import Qwen3SharedKVAttention
from .config import Qwen3SharedKVConfig
from .spec import QWEN3_SHARED_KV

__all__ = ["Qwen3SharedKVDecoderLayer", "Qwen3SharedKVModel", "Qwen3SharedKVForCausalLM",
           "Qwen3SharedKVPretrainedModel",
           "Qwen3SharedKVForCausalLMPipe"]

(Qwen3SharedKVDecoderLayer, Qwen3SharedKVPretrainedModel, Qwen3SharedKVModel, Qwen3SharedKVForCausalLM,
 Qwen3SharedKVForCausalLMPipe) = build_family(
    QWEN3_BASE, Variant(prefix="Qwen3SharedKV", label="Qwen3 shared-KV", config_class=Qwen3SharedKVConfig,
                        spec=QWEN3_SHARED_KV, module=__name__, attention=lambda config, layer_idx: Qwen3SharedKVAttention,
                        model_mixins=(CacheContinuingPositionsMixin,)))
