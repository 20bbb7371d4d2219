"""Qwen2-VHA: VHA (paddle_vha/vha/) over PaddleFormers' Qwen2. Everything but the base is VHA's own: the config fields
(VHAConfigMixin), the attention (VHAAttention: no q/k norms; Premix maps q_proj's output with its bias), the fold
(into stock Qwen2). Deviations from the Qwen3 variant, one line each:

* its folded form is stock Qwen2, so vha_shared_kv, sliding-window layers and sinks (folded forms over Qwen3 only)
  are refused.
"""
from __future__ import annotations

from paddleformers.transformers.qwen2.modeling import Qwen2Attention

from ..modeling.factory import Variant, build_family
from ..qwen3.modeling import CacheContinuingPositionsMixin
from ..qwen3.runtime import RuntimeSupport
from ..vha.attention import VHAAttention
from ..vha.config import VHAConfigMixin
from ..vha.fold_form import VHAFold
from .base import QWEN2_BASE
from .config import Qwen2Config
from .spec import QWEN2_VHA, QWEN2_VHA_LAYER

__all__ = ["Qwen2VHAConfig", "Qwen2VHAAttention", "Qwen2VHADecoderLayer", "Qwen2VHAPretrainedModel", "Qwen2VHAModel",
           "Qwen2VHAForCausalLM", "Qwen2VHAForCausalLMPipe", "QWEN2_VHA_FOLD"]


class Qwen2VHAConfig(VHAConfigMixin, RuntimeSupport, Qwen2Config):
    """Configuration of a Qwen2-VHA model: Qwen2Config plus the VHA fields (paddle_vha/vha/config.py)."""

    model_type = "qwen2_vha"
    runtime_label, causal_lm_name = "Qwen2-VHA", "Qwen2VHAForCausalLM"
    stock_fold_only = "Qwen2-VHA folds into stock Qwen2, which has no shared-KV, sliding-window or sink layers here"


class Qwen2VHAAttention(VHAAttention, Qwen2Attention):
    """Qwen2 attention with VHA."""

    layer_spec = QWEN2_VHA_LAYER


(Qwen2VHADecoderLayer, Qwen2VHAPretrainedModel, Qwen2VHAModel, Qwen2VHAForCausalLM,
 Qwen2VHAForCausalLMPipe) = build_family(QWEN2_BASE, Variant(
    prefix="Qwen2VHA", label="Qwen2-VHA", config_class=Qwen2VHAConfig, spec=QWEN2_VHA, module=__name__,
    attention=lambda config, layer_idx: Qwen2VHAAttention,
    model_mixins=(CacheContinuingPositionsMixin,)))  # Qwen2Model restarts positions at 0 after a filled cache

QWEN2_VHA_FOLD = VHAFold(QWEN2_BASE.model_type, QWEN2_BASE.name)