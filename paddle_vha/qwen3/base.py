"""PaddleFormers' dense Qwen3 as the base the families derive from (paddle_vha/spec/base.py)."""
from __future__ import annotations

from ..spec.base import Base
from .contract import check_config, check_config_fields
from .spec import QWEN3, QWEN3_LAYER

__all__ = ["QWEN3_BASE"]

QWEN3_BASE = Base(
    name="Qwen3",
    model_type="qwen3",
    module="paddleformers.transformers.qwen3.modeling",
    classes=dict(attention="Qwen3Attention", decoder_layer="Qwen3DecoderLayer", pretrained="Qwen3PretrainedModel",
                 model="Qwen3Model", causal_lm="Qwen3ForCausalLM", rotary="Qwen3RotaryEmbedding",
                 causal_lm_pipe="Qwen3ForCausalLMPipe"),
    config="paddleformers.transformers:Qwen3Config",
    spec=QWEN3,
    layer=QWEN3_LAYER,
    check_fields=check_config_fields,
    check_config=check_config,
)
