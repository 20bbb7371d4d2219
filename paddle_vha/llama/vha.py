"""Llama-VHA: VHA (paddle_vha/vha/) over PaddleFormers' Llama. Everything but the base is VHA's own: the config fields
(VHAConfigMixin), the attention (VHAAttention, which skips the q/k norms Llama has not), Premix and Postmix, the fold
(into stock Llama). Deviations from the Qwen3 variant, one line each:

* its folded form is stock Llama, so vha_shared_kv, sliding-window layers and sinks (folded forms over Qwen3 only)
  are refused;
* the backbone needs no position fix: LlamaModel already continues a filled cache's positions.
"""
from __future__ import annotations

from paddleformers.transformers import LlamaConfig
from paddleformers.transformers.llama.modeling import LLamaAttention

from ..modeling.factory import Variant, build_family
from ..qwen3.runtime import RuntimeSupport
from ..vha.attention import VHAAttention
from ..vha.config import VHAConfigMixin
from ..vha.fold_form import VHAFold
from .base import LLAMA_BASE
from .spec import LLAMA_VHA, LLAMA_VHA_LAYER

__all__ = ["LlamaVHAConfig", "LlamaVHAAttention", "LlamaVHADecoderLayer", "LlamaVHAPretrainedModel", "LlamaVHAModel",
           "LlamaVHAForCausalLM", "LlamaVHAForCausalLMPipe", "LLAMA_VHA_FOLD"]


class LlamaVHAConfig(VHAConfigMixin, RuntimeSupport, LlamaConfig):
    """Configuration of a Llama-VHA model: LlamaConfig plus the VHA fields (paddle_vha/vha/config.py)."""

    model_type = "llama_vha"
    runtime_label, causal_lm_name = "Llama-VHA", "LlamaVHAForCausalLM"
    stock_fold_only = "Llama-VHA folds into stock Llama, which has no shared-KV, sliding-window or sink layers"


class LlamaVHAAttention(VHAAttention, LLamaAttention):
    """Llama attention with VHA."""

    layer_spec = LLAMA_VHA_LAYER


(LlamaVHADecoderLayer, LlamaVHAPretrainedModel, LlamaVHAModel, LlamaVHAForCausalLM,
 LlamaVHAForCausalLMPipe) = build_family(LLAMA_BASE, Variant(
    prefix="LlamaVHA", label="Llama-VHA", config_class=LlamaVHAConfig, spec=LLAMA_VHA, module=__name__,
    attention=lambda config, layer_idx: LlamaVHAAttention))

LLAMA_VHA_FOLD = VHAFold(LLAMA_BASE.model_type, LLAMA_BASE.name)