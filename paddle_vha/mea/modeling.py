"""Qwen3-MEA models: stock PaddleFormers Qwen3 with MEA attention in the layers listed in mea_layers.

Mirrors paddle_vha/modeling.py; deviations from the parent classes are marked `# MEA:`. The on-disk layout
is the contract in docs/mea.md, checked by paddle_vha.mea.checkpoint.
"""
from __future__ import annotations

import os

import paddle
from paddle import nn
from paddleformers.nn.criterion.interface import CriterionLayer
from paddleformers.nn.embedding import Embedding as GeneralEmbedding
from paddleformers.nn.lm_head import LMHead as GeneralLMHead
from paddleformers.nn.norm import Norm as GeneralNorm
from paddleformers.transformers import AutoConfig, AutoModelForCausalLM
from paddleformers.transformers.model_utils import register_base_model
from paddleformers.transformers.qwen3.modeling import (
    Qwen3DecoderLayer,
    Qwen3ForCausalLM,
    Qwen3Model,
    Qwen3PretrainedModel,
    Qwen3RotaryEmbedding,
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


class Qwen3MEAPretrainedModel(Qwen3PretrainedModel):
    config_class = Qwen3MEAConfig
    # mea_k_lc, mea_v_lc and mea_norm.weight are not Linear weights: the flex-checkpoint name rules pass them
    # through unchanged, in the same layout in memory and on disk.

    def save_pretrained(self, save_dir, *args, **kwargs):
        super().save_pretrained(save_dir, *args, **kwargs)
        # MEA: PaddleFormers leaves a `saved_signal_<rank>` marker; it is not part of the checkpoint contract.
        for name in os.listdir(save_dir):
            if name.startswith("saved_signal_"):
                os.remove(os.path.join(save_dir, name))

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *args, **kwargs):
        # MEA: reject malformed checkpoints with one clear line before PaddleFormers reads them.
        if isinstance(pretrained_model_name_or_path, (str, os.PathLike)) and os.path.isdir(pretrained_model_name_or_path):
            from .checkpoint import validate_mea_checkpoint

            validate_mea_checkpoint(pretrained_model_name_or_path)
        return super().from_pretrained(pretrained_model_name_or_path, *args, **kwargs)


@register_base_model
class Qwen3MEAModel(Qwen3MEAPretrainedModel, Qwen3Model):
    def __init__(self, config: Qwen3MEAConfig):
        # Mirrors Qwen3Model.__init__, which hard-codes its decoder layer class.
        config.check_runtime_support()  # MEA: refuse unsupported runtime options before building anything
        Qwen3PretrainedModel.__init__(self, config)
        self.embed_tokens = GeneralEmbedding.create(
            config=config, num_embeddings=config.vocab_size, embedding_dim=config.hidden_size
        )
        self.layers = nn.LayerList(
            [Qwen3MEADecoderLayer(config, i) for i in range(config.num_hidden_layers)]  # MEA: decoder layer
        )
        self.norm = GeneralNorm.create(
            config=config,
            norm_type="rms_norm",
            hidden_size=config.hidden_size,
            norm_eps=config.rms_norm_eps,
            input_is_parallel=config.sequence_parallel,
        )
        self.rotary_emb = Qwen3RotaryEmbedding(config=config)
        self.has_sliding_layers = False  # refused by check_runtime_support
        self._needs_contiguous_positions = bool(config.mea_layer_indices) and config.mea_k_norm_position == "after_hlc"

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None,
                inputs_embeds=None, **kwargs):
        # Same fix as Qwen3VHAModel: with a filled cache and no position_ids, continue from the cache length
        # (stock Qwen3Model restarts at 0).
        if past_key_values is not None and past_key_values.get_seq_length() > 0:
            batch, seq = (input_ids if input_ids is not None else inputs_embeds).shape[:2]
            start = past_key_values.get_seq_length()
            expected = paddle.arange(start, start + seq, dtype="int64").expand([batch, seq])
            if position_ids is None:
                position_ids = expected
            elif self._needs_contiguous_positions and not bool((position_ids.astype("int64") == expected).all()):
                # MEA: 'after_hlc' layers re-rotate cached keys at positions 0..T-1 on every read, so a step whose
                # positions do not continue the cache (e.g. left-padded batches) would be silently wrong.
                raise MEAConfigError(
                    f"mea_k_norm_position='after_hlc' needs position_ids continuing the cache ({start}..{start + seq - 1} "
                    "in every row); for left-padded batched decoding use a 'before_hlc' model")
        return super().forward(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                               past_key_values=past_key_values, inputs_embeds=inputs_embeds, **kwargs)


class Qwen3MEAForCausalLM(Qwen3MEAPretrainedModel, Qwen3ForCausalLM):
    def __init__(self, config: Qwen3MEAConfig):
        # Mirrors Qwen3ForCausalLM.__init__ with the MEA backbone.
        Qwen3PretrainedModel.__init__(self, config)
        self.model = Qwen3MEAModel(config)  # MEA: backbone
        self.lm_head = GeneralLMHead(config)
        self.criterion = CriterionLayer(config)
        self.tie_weights()


def _register_auto_classes() -> None:
    """AutoConfig / AutoModelForCausalLM.from_config know qwen3_mea (same PaddleFormers 1.0.0 limits as VHA)."""
    AutoConfig.register(Qwen3MEAConfig.model_type, Qwen3MEAConfig, exist_ok=True)
    AutoModelForCausalLM.register(Qwen3MEAConfig, Qwen3MEAForCausalLM, exist_ok=True)


_register_auto_classes()
