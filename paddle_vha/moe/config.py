"""The Qwen3-MoE fields (Hugging Face's names) on top of a Qwen3 config class, validated with one-line errors.

    num_experts              E routed experts per MoE layer
    num_experts_per_tok      k experts a token is routed to (1 <= k <= E)
    moe_intermediate_size    I_e, the width of one expert's SwiGLU
    decoder_sparse_step      layer i is MoE when (i + 1) % step == 0 ...
    mlp_only_layers          ... and i is not listed here (those keep the dense MLP of width intermediate_size)
    norm_topk_prob           renormalise the k routing weights to sum to 1 (else the softmax values as they are)
    moe_shared_expert_intermediate_size, moe_shared_expert_gate
                             upstream PaddleFleet's shared expert (a SwiGLU of that width every token goes through,
                             optionally scaled by sigmoid(x w_g)); stock Qwen3-MoE has none (None, False)

The router is softmax over E logits (x W_r^T, W_r [E, h]), top-k, optional renormalisation; a MoE layer's output is
sum_j p_j * SwiGLU_{e_j}(x) (+ the shared expert).
"""
from __future__ import annotations

from paddleformers.transformers import Qwen3Config

__all__ = ["MoEFields", "MoEConfigError", "Qwen3MoeConfig", "moe_layers", "check_moe_fields", "HF_DEFAULTS"]

# Hugging Face Qwen3MoeConfig's defaults (transformers 4.57), so a config.json that leaves a field out reads as there
HF_DEFAULTS = dict(num_experts=128, num_experts_per_tok=8, moe_intermediate_size=768, decoder_sparse_step=1,
                   mlp_only_layers=None, norm_topk_prob=False, moe_shared_expert_intermediate_size=None,
                   moe_shared_expert_gate=False)
_POSITIVE = ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "decoder_sparse_step")


class MoEConfigError(ValueError):
    """A Qwen3-MoE configuration that cannot describe a valid model."""


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def check_moe_fields(fields: dict, num_layers=None) -> None:
    """MoEConfigError (one line naming the field) for a MoE field present in `fields` that is not what it must be."""
    for name in _POSITIVE:
        if name in fields and not (_is_int(fields[name]) and fields[name] >= 1):
            raise MoEConfigError(f"{name} must be a positive int, got {fields[name]!r}")
    e, k = fields.get("num_experts"), fields.get("num_experts_per_tok")
    if _is_int(e) and _is_int(k) and k > e:
        raise MoEConfigError(f"num_experts_per_tok={k} exceeds num_experts={e}")
    only = fields.get("mlp_only_layers")
    if only is not None and not (isinstance(only, list) and all(_is_int(i) and i >= 0 for i in only)):
        raise MoEConfigError(f"mlp_only_layers must be a list of layer indices, got {only!r}"[:200])
    if only and _is_int(num_layers) and max(only) >= num_layers:
        raise MoEConfigError(f"mlp_only_layers names layer {max(only)}, but the model has {num_layers} layers")
    for name in ("norm_topk_prob", "moe_shared_expert_gate"):
        if name in fields and not isinstance(fields[name], bool):
            raise MoEConfigError(f"{name} must be a bool, got {fields[name]!r}")
    shared = fields.get("moe_shared_expert_intermediate_size")
    if shared is not None and not (_is_int(shared) and shared >= 1):
        raise MoEConfigError(f"moe_shared_expert_intermediate_size must be None or a positive int, got {shared!r}")
    if fields.get("moe_shared_expert_gate") and shared is None:
        raise MoEConfigError("moe_shared_expert_gate=true but moe_shared_expert_intermediate_size is None (no "
                             "shared expert to gate)")


def moe_layers(cfg) -> list:
    """Indices of the MoE layers (Hugging Face's rule): not in mlp_only_layers and (i + 1) % decoder_sparse_step == 0."""
    only = set(cfg.mlp_only_layers or [])
    return [i for i in range(cfg.num_hidden_layers) if i not in only and (i + 1) % cfg.decoder_sparse_step == 0]


class MoEFields:
    """Mixed in before a Qwen3 config class: pops the MoE fields (HF_DEFAULTS for those not given), lets the Qwen3
    class take the rest, then validates them (MoEConfigError, one line)."""

    def __init__(self, **kwargs):
        moe = {k: kwargs.pop(k, v) for k, v in HF_DEFAULTS.items()}
        super().__init__(**kwargs)
        moe["mlp_only_layers"] = [] if moe["mlp_only_layers"] is None else moe["mlp_only_layers"]
        check_moe_fields(moe, getattr(self, "num_hidden_layers", None))
        for k, v in moe.items():
            setattr(self, k, v)

    @property
    def moe_layer_indices(self) -> list:
        return moe_layers(self)

    @property
    def has_shared_expert(self) -> bool:
        return self.moe_shared_expert_intermediate_size is not None


class Qwen3MoeConfig(MoEFields, Qwen3Config):
    r"""Stock Qwen3-MoE (Hugging Face's `qwen3_moe`): Qwen3Config's fields plus the MoE fields above; what a
    Qwen3-MoE-VHA checkpoint folds into. It has no shared expert (Hugging Face's Qwen3-MoE has none)."""

    model_type = "qwen3_moe"

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        if self.has_shared_expert:
            raise MoEConfigError("moe_shared_expert_intermediate_size is set: stock Qwen3-MoE has no shared expert")
