"""PaddleFormers' Qwen2 as a base the families derive from (paddle_vha/spec/base.py)."""
from __future__ import annotations

from ..spec.base import Base
from .contract import check_config, check_config_fields
from .spec import QWEN2, QWEN2_LAYER

__all__ = ["QWEN2_BASE"]

QWEN2_BASE = Base(
    name="Qwen2",
    model_type="qwen2",
    module="paddleformers.transformers.qwen2.modeling",
    classes=dict(attention="Qwen2Attention", decoder_layer="Qwen2DecoderLayer", pretrained="Qwen2PretrainedModel",
                 model="Qwen2Model", causal_lm="Qwen2ForCausalLM", rotary="Qwen2RotaryEmbedding",
                 causal_lm_pipe="Qwen2ForCausalLMPipe"),
    config="paddle_vha.qwen2.config:Qwen2Config",
    spec=QWEN2,
    layer=QWEN2_LAYER,
    check_fields=check_config_fields,
    check_config=check_config,
)
