"""PaddleFormers' Llama as a base the families derive from (paddle_vha/spec/base.py)."""
from __future__ import annotations

from ..spec.base import Base
from .contract import check_config, check_config_fields
from .spec import LLAMA, LLAMA_LAYER

__all__ = ["LLAMA_BASE"]

LLAMA_BASE = Base(
    name="Llama",
    model_type="llama",
    module="paddleformers.transformers.llama.modeling",
    classes=dict(attention="LLamaAttention", decoder_layer="LlamaDecoderLayer", pretrained="LlamaPretrainedModel",
                 model="LlamaModel", causal_lm="LlamaForCausalLM", rotary="LlamaRotaryEmbedding",
                 causal_lm_pipe="LlamaForCausalLMPipe"),
    config="paddleformers.transformers:LlamaConfig",
    spec=LLAMA,
    layer=LLAMA_LAYER,
    check_fields=check_config_fields,
    check_config=check_config,
)
