"""Qwen3-VHA models: stock PaddleFormers Qwen3 with the attention swapped for Qwen3VHAAttention.

Deviations from the parent classes are marked `# VHA:`. The on-disk layout is the public contract
described in docs/checkpoint.md (paddle_vha/vha/contract.py), checked before every load.
"""
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
from .attention import Qwen3VHAAttention
from .config import Qwen3VHAConfig

__all__ = ["Qwen3VHADecoderLayer", "Qwen3VHAModel", "Qwen3VHAForCausalLM", "Qwen3VHAPretrainedModel"]


class Qwen3VHADecoderLayer(Qwen3DecoderLayer):
    def __init__(self, config: Qwen3VHAConfig, layer_idx: int):
        super().__init__(config, layer_idx)
        self.self_attn = Qwen3VHAAttention(config, layer_idx)  # VHA: the only change to the decoder layer


class Qwen3VHAPretrainedModel(ContractCheckpointMixin, Qwen3PretrainedModel):
    config_class = Qwen3VHAConfig

    @classmethod
    def _gen_aoa_config(cls, config: Qwen3VHAConfig):
        return cls._linear_rules(super()._gen_aoa_config(config), config, to_disk=False)

    @classmethod
    def _gen_inv_aoa_config(cls, config: Qwen3VHAConfig):
        return cls._linear_rules(super()._gen_inv_aoa_config(config), config, to_disk=True)

    @classmethod
    def _linear_rules(cls, aoa: dict, config: Qwen3VHAConfig, to_disk: bool) -> dict:
        # VHA: the gate and the shared KV projection are Linears the parent's name rules do not know
        extra = (["gate_proj"] if config.vha_gated_attention else []) + (["shared_kv_proj"] if config.vha_shared_kv else [])
        return linear_transpose_rules(cls, aoa, extra, to_disk, shared_kv=config.vha_shared_kv)


@register_base_model
class Qwen3VHAModel(Qwen3VHAPretrainedModel, CacheContinuingPositionsMixin, Qwen3Model):  # VHA: positions go on
    # from a filled cache (the mixin; stock Qwen3Model restarts them at 0)
    def __init__(self, config: Qwen3VHAConfig):
        config.check_runtime_support()  # VHA: refuse unsupported runtime options before building anything
        full = config.full_dims()
        others = {(dims.head_dim, float(dims.rope_theta)) for dims in map(config.layer_dims, config.window_layers())}
        others.discard((full.head_dim, float(full.rope_theta)))
        init_qwen3_backbone(self, config, Qwen3VHADecoderLayer, sorted(others))  # VHA: decoder layer (and the RoPE
        # tables of window layers with their own head width or base)


class Qwen3VHAForCausalLM(Qwen3VHAPretrainedModel, Qwen3ForCausalLM):
    def __init__(self, config: Qwen3VHAConfig):
        init_qwen3_causal_lm(self, config, Qwen3VHAModel)  # VHA: backbone


register_auto_classes(Qwen3VHAConfig, Qwen3VHAForCausalLM)
