"""The Qwen3-MoE fields as data, Paddle-free (the registry, the specs and the calculators import this without Paddle):
their Hugging Face defaults, their one-line checks, and which layers are MoE (paddle_vha/moe/config.py builds the
config classes on them)."""
from __future__ import annotations

__all__ = ["HF_DEFAULTS", "MoEConfigError", "check_moe_fields", "moe_layers"]

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
