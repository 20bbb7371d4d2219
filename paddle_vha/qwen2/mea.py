"""Qwen2-MEA: MEA (paddle_vha/mea/) over PaddleFormers' Qwen2: the config fields (MEAConfigMixin), the attentions
(MEAAttention, StockKVAttention: no q/k norms, Qwen2's rotary embedding for the keys' angles; k/v biases through HLC
as their projections' outputs)."""
from __future__ import annotations

from paddleformers.transformers.qwen2.modeling import Qwen2Attention, Qwen2RotaryEmbedding

from ..mea.attention import MEAAttention, StockKVAttention
from ..mea.config import MEAConfigMixin
from ..mea.modeling import MEAPositions
from ..modeling.factory import Variant, build_family
from ..qwen3.runtime import RuntimeSupport
from .base import QWEN2_BASE
from .config import Qwen2Config
from .spec import QWEN2_MEA, QWEN2_MEA_LAYER, QWEN2_MEA_STOCK_LAYER

__all__ = ["Qwen2MEAConfig", "Qwen2MEAAttention", "Qwen2StockKVAttention", "Qwen2MEADecoderLayer",
           "Qwen2MEAPretrainedModel", "Qwen2MEAModel", "Qwen2MEAForCausalLM", "Qwen2MEAForCausalLMPipe"]


class Qwen2MEAConfig(MEAConfigMixin, RuntimeSupport, Qwen2Config):
    """Configuration of a Qwen2-MEA model: Qwen2Config plus the MEA fields (paddle_vha/mea/config.py)."""

    model_type = "qwen2_mea"
    runtime_label, causal_lm_name = "Qwen2-MEA", "Qwen2MEAForCausalLM"


class Qwen2MEAAttention(MEAAttention, Qwen2Attention):
    """Qwen2 attention with MEA."""

    layer_spec, rotary_class = QWEN2_MEA_LAYER, Qwen2RotaryEmbedding


class Qwen2StockKVAttention(StockKVAttention, Qwen2Attention):
    """Stock Qwen2 attention with its own KV heads in a Qwen2-MEA model."""

    layer_spec = QWEN2_MEA_STOCK_LAYER


(Qwen2MEADecoderLayer, Qwen2MEAPretrainedModel, Qwen2MEAModel, Qwen2MEAForCausalLM,
 Qwen2MEAForCausalLMPipe) = build_family(QWEN2_BASE, Variant(
    prefix="Qwen2MEA", label="Qwen2-MEA", config_class=Qwen2MEAConfig, spec=QWEN2_MEA, module=__name__,
    attention=lambda config, i: Qwen2MEAAttention if config.is_mea_layer(i) else Qwen2StockKVAttention,
    model_mixins=(MEAPositions,)))
