"""Qwen3-with-sinks models: PaddleFormers' Qwen3 classes with Qwen3SinksAttention in every layer
(paddle_vha/modeling/factory.py); positions continue a filled cache (stock Qwen3Model restarts them at 0)."""
from __future__ import annotations

from ..modeling.factory import Variant, build_family
from ..qwen3.base import QWEN3_BASE
from ..qwen3.modeling import CacheContinuingPositionsMixin
from .attention import Qwen3SinksAttention
from .config import Qwen3SinksConfig
from .spec import QWEN3_SINKS

__all__ = ["Qwen3SinksDecoderLayer", "Qwen3SinksModel", "Qwen3SinksForCausalLM", "Qwen3SinksPretrainedModel",
           "Qwen3SinksForCausalLMPipe"]

(Qwen3SinksDecoderLayer, Qwen3SinksPretrainedModel, Qwen3SinksModel, Qwen3SinksForCausalLM,
 Qwen3SinksForCausalLMPipe) = build_family(
    QWEN3_BASE, Variant(prefix="Qwen3Sinks", label="Qwen3 with sinks", config_class=Qwen3SinksConfig,
                        spec=QWEN3_SINKS, module=__name__, attention=lambda config, layer_idx: Qwen3SinksAttention,
                        model_mixins=(CacheContinuingPositionsMixin,)))
