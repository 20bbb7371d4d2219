"""What both families take from PaddleFormers' Qwen3 model classes: the builders with another decoder layer or
backbone, cache-continuing positions, single-device Linears, and checkpoint save/load through the family contract."""
from __future__ import annotations

import copy
import os

import paddle
from paddle import nn
from paddleformers.nn.attention.interface import ALL_ATTENTION_FUNCTIONS
from paddleformers.nn.criterion.interface import CriterionLayer
from paddleformers.nn.embedding import Embedding as GeneralEmbedding
from paddleformers.nn.lm_head import LMHead as GeneralLMHead
from paddleformers.nn.norm import Norm as GeneralNorm
from paddleformers.transformers import AutoConfig, AutoModelForCausalLM
from paddleformers.transformers.qwen3.modeling import Qwen3PretrainedModel, Qwen3RotaryEmbedding

from ..checkpoint.folder import remove_save_marker
from ..families import family

__all__ = ["ContractCheckpointMixin", "CacheContinuingPositionsMixin", "init_qwen3_backbone", "init_qwen3_causal_lm", "cache_continuation_positions",
           "single_device_linear", "attention_core", "update_shared_kv_cache", "linear_transpose_rules",
           "register_auto_classes", "RoPETables", "LayerwiseRotaryEmbedding"]


def single_device_linear(in_features: int, out_features: int, bias: bool) -> nn.Linear:
    """A plain Linear ([in, out] weight). The families build single-device layers only; tensor parallelism is applied
    from outside by paddle_vha.parallel, so no fleet parallel-layer type is named here."""
    return nn.Linear(in_features, out_features, bias_attr=bias)


def attention_core(layer, q, k, v, attention_mask=None, attn_mask_startend_row_indices=None):
    """Softmax attention through the backend the config names (`eager`, `sdpa`, ...), as Qwen3Attention.forward calls
    it. q (B, H, S, d); k, v (B, H_kv, T, d), read in groups of layer.num_key_value_groups; attention_mask
    (B, 1, S, >= T), whose last T columns are the keys'. Returns the output (B, S, H*d) and the weights (or None)."""
    attention_interface = ALL_ATTENTION_FUNCTIONS[layer.config._attn_implementation]
    if attention_mask is not None and attention_mask.shape[-1] > k.shape[-2]:
        # Deviation from Qwen3Attention: a sliding-window cache layer returns only its last keys while PaddleFormers
        # builds the mask over the whole past and the eager backend keeps its *first* columns; keep the last ones.
        attention_mask = attention_mask[..., -k.shape[-2]:]
    return attention_interface(
        layer,
        query=q,
        key=k,
        value=v,
        attention_mask=attention_mask,
        attn_mask_startend_row_indices=attn_mask_startend_row_indices,
        dropout=0.0 if not layer.training else layer.attention_dropout,
        scaling=layer.scaling,
    )


def update_shared_kv_cache(cache, s, layer_idx: int):
    """A shared K = V tensor s (B, H_kv, S, d) through a PaddleFormers cache: stored once (the cache's value slot gets
    a zero-width tensor, so it holds no bytes), the whole cached tensor (B, H_kv, T, d) returned. Sliding-window cache
    layers trim it as they trim keys."""
    keys, _ = cache.update(s, s[..., :0], layer_idx)
    return keys


class RoPETables(tuple):
    """(cos, sin) at the model's head width and RoPE base, as Qwen3 passes position_embeddings to every layer, plus the
    tables of the other (head_dim, rope_theta) some layers use (sliding-window layers with their own sizes)."""

    def __new__(cls, cos, sin, others):
        tables = super().__new__(cls, (cos, sin))
        tables.others = others
        return tables

    def for_layer(self, head_dim: int, rope_theta: float):
        return self.others.get((head_dim, float(rope_theta)), (self[0], self[1]))


class LayerwiseRotaryEmbedding(nn.Layer):
    """Qwen3RotaryEmbedding for the model's head width, and one more per other (head_dim, rope_theta) in `others`;
    returns RoPETables."""

    def __init__(self, config, others):
        super().__init__()
        self.main = Qwen3RotaryEmbedding(config=config)
        self.others = {}
        for i, (head_dim, theta) in enumerate(sorted(set(others))):
            cfg = copy.copy(config)
            cfg.head_dim, cfg.rope_theta = head_dim, theta
            cfg.rope_parameters = {**(getattr(config, "rope_parameters", None) or {}), "rope_theta": theta}
            rotary = Qwen3RotaryEmbedding(config=cfg)
            self.add_sublayer(f"other_{i}", rotary)
            self.others[(head_dim, float(theta))] = rotary

    def forward(self, x, position_ids):
        cos, sin = self.main(x, position_ids)
        return RoPETables(cos, sin, {key: rotary(x, position_ids) for key, rotary in self.others.items()})


def init_qwen3_backbone(model, config, decoder_layer_cls, rotary_others=()) -> None:
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
    # layers with another head width or RoPE base read their own tables (RoPETables.for_layer)
    model.rotary_emb = LayerwiseRotaryEmbedding(config, rotary_others) if rotary_others else \
        Qwen3RotaryEmbedding(config=config)
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


class CacheContinuingPositionsMixin:
    """Put before Qwen3Model in a backbone's bases: without position_ids, positions continue a filled cache
    (cache_continuation_positions) instead of restarting at 0."""

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None,
                inputs_embeds=None, **kwargs):
        if position_ids is None:
            position_ids = cache_continuation_positions(past_key_values, input_ids, inputs_embeds)
        return super().forward(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                               past_key_values=past_key_values, inputs_embeds=inputs_embeds, **kwargs)


class ContractCheckpointMixin:
    """save_pretrained without PaddleFormers' save marker; from_pretrained validates the folder against the family's
    tensor contract first (one-line CheckpointError on a malformed folder, nothing read before)."""

    def save_pretrained(self, save_dir, *args, **kwargs):
        super().save_pretrained(save_dir, *args, **kwargs)
        remove_save_marker(save_dir)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *args, **kwargs):
        if isinstance(pretrained_model_name_or_path, (str, os.PathLike)) and os.path.isdir(pretrained_model_name_or_path):
            family(cls.config_class.model_type).validate(pretrained_model_name_or_path)
        return super().from_pretrained(pretrained_model_name_or_path, *args, **kwargs)


def linear_transpose_rules(cls, aoa: dict, names, to_disk: bool, shared_kv: bool = False) -> dict:
    """PaddleFormers' flex-checkpoint name rules (`_gen_aoa_config` / `_gen_inv_aoa_config`) for a model class `cls`
    with extra attention Linears `names` (e.g. gate_proj, shared_kv_proj): each is [out, in] on disk and [in, out]
    in memory, so it needs a transpose rule both ways, or PaddleFormers writes it untransposed (breaking the HF
    layout). With shared_kv the parent's k_proj / v_proj rules name tensors that do not exist and are dropped."""
    if shared_kv:
        aoa["aoa_statements"] = [s for s in aoa["aoa_statements"]
                                 if ".self_attn.k_proj." not in s and ".self_attn.v_proj." not in s]
    for name in names:
        memory = ("" if cls == cls.base_model_class else "model.") + f"layers.$LAYER_ID.self_attn.{name}.weight"
        disk = f"model.layers.$LAYER_ID.self_attn.{name}.weight"
        src, dst = (memory, disk) if to_disk else (disk, memory)
        aoa["aoa_statements"].append(f"{src}^T -> {dst}")
    return aoa


def register_auto_classes(config_cls, causal_lm_cls) -> None:
    """AutoConfig.from_pretrained and AutoModelForCausalLM.from_config know the family's model_type.

    PaddleFormers 1.0.0 keeps one config -> model table for all Auto model classes, and its from_pretrained
    matches `architectures` against built-in name prefixes first ("Qwen3VHA..." -> stock Qwen3), so
    checkpoints load through the family's own from_pretrained (docs/method.md, "Auto classes").
    """
    AutoConfig.register(config_cls.model_type, config_cls, exist_ok=True)
    AutoModelForCausalLM.register(config_cls, causal_lm_cls, exist_ok=True)
