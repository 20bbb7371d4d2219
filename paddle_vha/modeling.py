"""Qwen3-VHA models: stock PaddleFormers Qwen3 with the attention swapped for Qwen3VHAAttention.

Deviations from the parent classes are marked `# VHA:`. The on-disk layout is the public contract
described in docs/checkpoint.md and checked by paddle_vha.checkpoint.
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

from .attention import Qwen3VHAAttention
from .config import Qwen3VHAConfig

__all__ = ["Qwen3VHADecoderLayer", "Qwen3VHAModel", "Qwen3VHAForCausalLM", "Qwen3VHAPretrainedModel",
           "ContractCheckpointMixin", "init_qwen3_backbone", "init_qwen3_causal_lm", "cache_continuation_positions"]


def init_qwen3_backbone(model, config, decoder_layer_cls) -> None:
    """The body of Qwen3Model.__init__ with another decoder layer class.

    PaddleFormers hard-codes Qwen3DecoderLayer there; building the stock layers first and replacing them would
    hold two models in memory at once.
    """
    Qwen3PretrainedModel.__init__(model, config)
    model.embed_tokens = GeneralEmbedding.create(
        config=config, num_embeddings=config.vocab_size, embedding_dim=config.hidden_size
    )
    model.layers = nn.LayerList([decoder_layer_cls(config, i) for i in range(config.num_hidden_layers)])
    model.norm = GeneralNorm.create(
        config=config,
        norm_type="rms_norm",
        hidden_size=config.hidden_size,
        norm_eps=config.rms_norm_eps,
        input_is_parallel=config.sequence_parallel,
    )
    model.rotary_emb = Qwen3RotaryEmbedding(config=config)
    model.has_sliding_layers = getattr(config, "sliding_window", None) is not None and "sliding_attention" in (
        getattr(config, "layer_types", None) or []
    )


def init_qwen3_causal_lm(model, config, backbone_cls) -> None:
    """The body of Qwen3ForCausalLM.__init__ with another backbone class."""
    Qwen3PretrainedModel.__init__(model, config)
    model.model = backbone_cls(config)
    model.lm_head = GeneralLMHead(config)
    model.criterion = CriterionLayer(config)
    model.tie_weights()


def cache_continuation_positions(past_key_values, input_ids=None, inputs_embeds=None):
    """Positions (B, S) that continue a filled cache, or None when there is no filled cache.

    Fix of a parent quirk: Qwen3Model numbers positions from 0 even when a filled cache is passed, which rotates
    new tokens as if they were at the start.
    """
    if past_key_values is None or past_key_values.get_seq_length() == 0:
        return None
    batch, seq = (input_ids if input_ids is not None else inputs_embeds).shape[:2]
    start = past_key_values.get_seq_length()
    return paddle.arange(start, start + seq, dtype="int64").expand([batch, seq])


class ContractCheckpointMixin:
    """save_pretrained without PaddleFormers' save marker; from_pretrained validates the folder first.

    Subclasses name their validator (one-line CheckpointError on a malformed folder) in `_validate_checkpoint`.
    """

    @staticmethod
    def _validate_checkpoint(path: str) -> None:
        raise NotImplementedError

    def save_pretrained(self, save_dir, *args, **kwargs):
        super().save_pretrained(save_dir, *args, **kwargs)
        # PaddleFormers leaves a `saved_signal_<rank>` marker; it is not part of the checkpoint contract.
        for name in os.listdir(save_dir):
            if name.startswith("saved_signal_"):
                os.remove(os.path.join(save_dir, name))

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *args, **kwargs):
        # Reject malformed checkpoints with one clear line before PaddleFormers reads them.
        if isinstance(pretrained_model_name_or_path, (str, os.PathLike)) and os.path.isdir(pretrained_model_name_or_path):
            cls._validate_checkpoint(pretrained_model_name_or_path)
        return super().from_pretrained(pretrained_model_name_or_path, *args, **kwargs)


class Qwen3VHADecoderLayer(Qwen3DecoderLayer):
    def __init__(self, config: Qwen3VHAConfig, layer_idx: int):
        super().__init__(config, layer_idx)
        self.self_attn = Qwen3VHAAttention(config, layer_idx)  # VHA: the only change to the decoder layer


class Qwen3VHAPretrainedModel(ContractCheckpointMixin, Qwen3PretrainedModel):
    config_class = Qwen3VHAConfig

    @staticmethod
    def _validate_checkpoint(path: str) -> None:
        from .checkpoint import validate_vha_checkpoint

        validate_vha_checkpoint(path)

    @classmethod
    def _gen_aoa_config(cls, config: Qwen3VHAConfig):
        return cls._add_gate_rule(super()._gen_aoa_config(config), config, to_disk=False)

    @classmethod
    def _gen_inv_aoa_config(cls, config: Qwen3VHAConfig):
        return cls._add_gate_rule(super()._gen_inv_aoa_config(config), config, to_disk=True)

    @classmethod
    def _add_gate_rule(cls, aoa: dict, config: Qwen3VHAConfig, to_disk: bool) -> dict:
        # VHA: the attention gate is a Linear: [out, in] on disk, [in, out] in memory. New Linears need a
        # transpose rule both ways, or PaddleFormers writes them untransposed (breaking the HF layout).
        if config.vha_gated_attention:
            memory = ("" if cls == cls.base_model_class else "model.") + "layers.$LAYER_ID.self_attn.gate_proj.weight"
            disk = "model.layers.$LAYER_ID.self_attn.gate_proj.weight"
            src, dst = (memory, disk) if to_disk else (disk, memory)
            aoa["aoa_statements"].append(f"{src}^T -> {dst}")
        return aoa


@register_base_model
class Qwen3VHAModel(Qwen3VHAPretrainedModel, Qwen3Model):
    def __init__(self, config: Qwen3VHAConfig):
        config.check_runtime_support()  # VHA: refuse unsupported runtime options before building anything
        init_qwen3_backbone(self, config, Qwen3VHADecoderLayer)  # VHA: decoder layer

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None,
                inputs_embeds=None, **kwargs):
        if position_ids is None:  # positions continue a filled cache (stock Qwen3Model restarts them at 0)
            position_ids = cache_continuation_positions(past_key_values, input_ids, inputs_embeds)
        return super().forward(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                               past_key_values=past_key_values, inputs_embeds=inputs_embeds, **kwargs)


class Qwen3VHAForCausalLM(Qwen3VHAPretrainedModel, Qwen3ForCausalLM):
    def __init__(self, config: Qwen3VHAConfig):
        init_qwen3_causal_lm(self, config, Qwen3VHAModel)  # VHA: backbone


def _register_auto_classes() -> None:
    """AutoConfig.from_pretrained and AutoModelForCausalLM.from_config know qwen3_vha.

    PaddleFormers 1.0.0 keeps one config -> model table for all Auto model classes, and its from_pretrained
    matches `architectures` against built-in name prefixes first ("Qwen3VHA..." -> stock Qwen3), so
    checkpoints load through Qwen3VHAForCausalLM.from_pretrained (docs/method.md, "Auto classes").
    """
    AutoConfig.register(Qwen3VHAConfig.model_type, Qwen3VHAConfig, exist_ok=True)
    AutoModelForCausalLM.register(Qwen3VHAConfig, Qwen3VHAForCausalLM, exist_ok=True)


_register_auto_classes()
