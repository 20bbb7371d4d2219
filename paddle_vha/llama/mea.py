"""Llama-MEA: MEA (paddle_vha/mea/) over PaddleFormers' Llama: the config fields (MEAConfigMixin), the attentions
(MEAAttention, StockKVAttention: no q/k norms, Llama's rotary embedding for the keys' angles). With no k_norm, 'before_hlc' and 'after_hlc' are the same function (RoPE commutes with HLC)."""
from __future__ import annotations

from paddleformers.transformers import LlamaConfig
from paddleformers.transformers.llama.modeling import LLamaAttention, LlamaRotaryEmbedding

from ..mea.attention import MEAAttention, StockKVAttention
from ..mea.config import MEAConfigMixin
from ..mea.modeling import MEAPositions
from ..modeling.factory import Variant, build_family
from ..qwen3.runtime import RuntimeSupport
from .base import LLAMA_BASE
from .spec import LLAMA_MEA, LLAMA_MEA_LAYER, LLAMA_MEA_STOCK_LAYER

__all__ = ["LlamaMEAConfig", "LlamaMEAAttention", "LlamaStockKVAttention", "LlamaMEADecoderLayer",
           "LlamaMEAPretrainedModel", "LlamaMEAModel", "LlamaMEAForCausalLM", "LlamaMEAForCausalLMPipe"]

class LlamaMEAConfig(MEAConfigMixin, RuntimeSupport, LlamaConfig):
    """Configuration of a Llama-MEA model: LlamaConfig plus the MEA fields (paddle_vha/mea/config.py)."""

    model_type = "llama_mea"
    runtime_label, causal_lm_name = "Llama-MEA", "LlamaMEAForCausalLM"


class LlamaMEAAttention(MEAAttention, LLamaAttention):
    """Llama attention with MEA."""

    layer_spec, rotary_class = LLAMA_MEA_LAYER, LlamaRotaryEmbedding


class LlamaStockKVAttention(StockKVAttention, LLamaAttention):
    """Stock Llama attention with its own KV heads in a Llama-MEA model."""

    layer_spec = LLAMA_MEA_STOCK_LAYER


(LlamaMEADecoderLayer, LlamaMEAPretrainedModel, LlamaMEAModel, LlamaMEAForCausalLM,
 LlamaMEAForCausalLMPipe) = build_family(LLAMA_BASE, Variant(
    prefix="LlamaMEA", label="Llama-MEA", config_class=LlamaMEAConfig, spec=LLAMA_MEA, module=__name__,
    attention=lambda config, i: LlamaMEAAttention if config.is_mea_layer(i) else LlamaStockKVAttention,
    model_mixins=(MEAPositions,)))
