"""Qwen3-MEA models: PaddleFormers' Qwen3 classes with MEA attention in the layers listed in mea_layers and stock
attention (its own KV heads) in the others (paddle_vha/modeling/factory.py).

The backbone's one deviation beyond the attention is MEAPositions. The on-disk layout is declared in
paddle_vha/mea/spec.py (docs/mea.md), checked before every load.
"""
from __future__ import annotations

from ..modeling.factory import Variant, build_family
from ..qwen3.base import QWEN3_BASE
from ..qwen3.modeling import cache_continuation_positions
from .attention import Qwen3MEAAttention, Qwen3StockKVAttention
from .config import MEAConfigError, Qwen3MEAConfig
from .spec import QWEN3_MEA

__all__ = ["Qwen3MEADecoderLayer", "Qwen3MEAModel", "Qwen3MEAForCausalLM", "Qwen3MEAPretrainedModel",
           "Qwen3MEAForCausalLMPipe", "MEAPositions"]


class MEAPositions:
    """Positions continue a filled cache (as Qwen3VHAModel); 'after_hlc' layers refuse positions that do not."""

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None,
                inputs_embeds=None, **kwargs):
        expected = cache_continuation_positions(past_key_values, input_ids, inputs_embeds)
        needs_contiguous = bool(self.config.mea_layer_indices) and self.config.mea_k_norm_position == "after_hlc"
        if position_ids is None:
            position_ids = expected
        elif expected is not None and needs_contiguous and not bool(
                (position_ids.astype("int64") == expected).all()):
            # 'after_hlc' layers re-rotate cached keys at positions 0..T-1 on every read, so a step whose positions
            # do not continue the cache (e.g. left-padded batches) would be silently wrong.
            start, seq = past_key_values.get_seq_length(), expected.shape[1]
            raise MEAConfigError(
                f"mea_k_norm_position='after_hlc' needs position_ids continuing the cache ({start}..{start + seq - 1} "
                "in every row); for left-padded batched decoding use a 'before_hlc' model")
        return super().forward(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                               past_key_values=past_key_values, inputs_embeds=inputs_embeds, **kwargs)


def _attention(config: Qwen3MEAConfig, layer_idx: int) -> type:
    """MEA attention in mea_layers; elsewhere stock attention with its own (mea_stock_kv_heads) KV heads."""
    return Qwen3MEAAttention if config.is_mea_layer(layer_idx) else Qwen3StockKVAttention


(Qwen3MEADecoderLayer, Qwen3MEAPretrainedModel, Qwen3MEAModel, Qwen3MEAForCausalLM,
 Qwen3MEAForCausalLMPipe) = build_family(QWEN3_BASE, Variant(
    prefix="Qwen3MEA", label="Qwen3-MEA", config_class=Qwen3MEAConfig, spec=QWEN3_MEA, module=__name__,
    attention=_attention, model_mixins=(MEAPositions,)))
