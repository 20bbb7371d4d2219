"""Qwen3-MEA models: stock PaddleFormers Qwen3 with MEA attention in the layers listed in mea_layers.

Mirrors paddle_vha/vha/modeling.py; deviations from the parent classes are marked `# MEA:`. The on-disk layout
is the contract in docs/mea.md (paddle_vha/mea/contract.py), checked before every load.
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
    cache_continuation_positions,
    init_qwen3_backbone,
    init_qwen3_causal_lm,
    register_auto_classes,
)
from .attention import Qwen3MEAAttention, Qwen3StockKVAttention
from .config import MEAConfigError, Qwen3MEAConfig

__all__ = ["Qwen3MEADecoderLayer", "Qwen3MEAModel", "Qwen3MEAForCausalLM", "Qwen3MEAPretrainedModel"]


class Qwen3MEADecoderLayer(Qwen3DecoderLayer):
    def __init__(self, config: Qwen3MEAConfig, layer_idx: int):
        super().__init__(config, layer_idx)
        # MEA: the only change to the decoder layer; non-MEA layers keep stock attention with their own KV heads.
        cls = Qwen3MEAAttention if config.is_mea_layer(layer_idx) else Qwen3StockKVAttention
        self.self_attn = cls(config, layer_idx)


class Qwen3MEAPretrainedModel(ContractCheckpointMixin, Qwen3PretrainedModel):
    config_class = Qwen3MEAConfig
    # mea_k_lc, mea_v_lc and mea_norm.weight are not Linear weights: the flex-checkpoint name rules pass them
    # through unchanged, in the same layout in memory and on disk.


@register_base_model
class Qwen3MEAModel(Qwen3MEAPretrainedModel, Qwen3Model):
    def __init__(self, config: Qwen3MEAConfig):
        config.check_runtime_support()  # MEA: refuse unsupported runtime options before building anything
        init_qwen3_backbone(self, config, Qwen3MEADecoderLayer)  # MEA: decoder layer
        self._needs_contiguous_positions = bool(config.mea_layer_indices) and config.mea_k_norm_position == "after_hlc"

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None,
                inputs_embeds=None, **kwargs):
        expected = cache_continuation_positions(past_key_values, input_ids, inputs_embeds)  # as Qwen3VHAModel
        if position_ids is None:
            position_ids = expected
        elif expected is not None and self._needs_contiguous_positions and not bool(
                (position_ids.astype("int64") == expected).all()):
            # MEA: 'after_hlc' layers re-rotate cached keys at positions 0..T-1 on every read, so a step whose
            # positions do not continue the cache (e.g. left-padded batches) would be silently wrong.
            start, seq = past_key_values.get_seq_length(), expected.shape[1]
            raise MEAConfigError(
                f"mea_k_norm_position='after_hlc' needs position_ids continuing the cache ({start}..{start + seq - 1} "
                "in every row); for left-padded batched decoding use a 'before_hlc' model")
        return super().forward(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                               past_key_values=past_key_values, inputs_embeds=inputs_embeds, **kwargs)


class Qwen3MEAForCausalLM(Qwen3MEAPretrainedModel, Qwen3ForCausalLM):
    def __init__(self, config: Qwen3MEAConfig):
        init_qwen3_causal_lm(self, config, Qwen3MEAModel)  # MEA: backbone


register_auto_classes(Qwen3MEAConfig, Qwen3MEAForCausalLM)  # same PaddleFormers 1.0.0 limits as VHA
