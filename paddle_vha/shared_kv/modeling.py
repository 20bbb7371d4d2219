"""Qwen3 shared-KV models: stock PaddleFormers Qwen3 with Qwen3SharedKVAttention. Deviations are marked `# SKV:`."""
from __future__ import annotations

from paddleformers.transformers.model_utils import register_base_model
from paddleformers.transformers.qwen3.modeling import (
    Qwen3DecoderLayer,
    Qwen3ForCausalLM,
    Qwen3Model,
    Qwen3PretrainedModel,
)

from ..qwen3.modeling import (
    ContractCheckpointMixin,
    CacheContinuingPositionsMixin,
    init_qwen3_backbone,
    init_qwen3_causal_lm,
    linear_transpose_rules,
    register_auto_classes,
)
from .attention import Qwen3SharedKVAttention
from .config import Qwen3SharedKVConfig

__all__ = ["Qwen3SharedKVDecoderLayer", "Qwen3SharedKVModel", "Qwen3SharedKVForCausalLM",
           "Qwen3SharedKVPretrainedModel"]


class Qwen3SharedKVDecoderLayer(Qwen3DecoderLayer):
    def __init__(self, config: Qwen3SharedKVConfig, layer_idx: int):
        super().__init__(config, layer_idx)
        self.self_attn = Qwen3SharedKVAttention(config, layer_idx)  # SKV: the only change to the decoder layer


class Qwen3SharedKVPretrainedModel(ContractCheckpointMixin, Qwen3PretrainedModel):
    config_class = Qwen3SharedKVConfig

    @classmethod
    def _gen_aoa_config(cls, config):
        return linear_transpose_rules(cls, super()._gen_aoa_config(config), ["shared_kv_proj"], False, shared_kv=True)

    @classmethod
    def _gen_inv_aoa_config(cls, config):
        return linear_transpose_rules(cls, super()._gen_inv_aoa_config(config), ["shared_kv_proj"], True,
                                      shared_kv=True)


@register_base_model
class Qwen3SharedKVModel(Qwen3SharedKVPretrainedModel, CacheContinuingPositionsMixin, Qwen3Model):  # SKV: positions
    # go on from a filled cache (the mixin; stock Qwen3Model restarts them at 0)
    def __init__(self, config: Qwen3SharedKVConfig):
        config.check_runtime_support()
        init_qwen3_backbone(self, config, Qwen3SharedKVDecoderLayer)  # SKV: decoder layer


class Qwen3SharedKVForCausalLM(Qwen3SharedKVPretrainedModel, Qwen3ForCausalLM):
    def __init__(self, config: Qwen3SharedKVConfig):
        init_qwen3_causal_lm(self, config, Qwen3SharedKVModel)  # SKV: backbone


register_auto_classes(Qwen3SharedKVConfig, Qwen3SharedKVForCausalLM)
