"""Qwen3MoeVHAConfig: Qwen3VHAConfig (paddle_vha/vha/config.py: H_v virtual heads over H_kv KV heads, r, Postmix rank
R, shared KV, gate, windows) plus the Qwen3-MoE fields (paddle_vha/moe/config.py), and what of it has no stock
Qwen3-MoE form (fold_refusal)."""
from __future__ import annotations

from typing import Optional

from ..moe.config import MoEFields
from ..vha.config import Qwen3VHAConfig

__all__ = ["Qwen3MoeVHAConfig", "fold_refusal"]


class Qwen3MoeVHAConfig(MoEFields, Qwen3VHAConfig):
    r"""A Qwen3-MoE-VHA checkpoint's config: every Qwen3VHAConfig field (and upstream PaddleFleet's VHA names), and
    num_experts, num_experts_per_tok, moe_intermediate_size, decoder_sparse_step, mlp_only_layers, norm_topk_prob,
    moe_shared_expert_intermediate_size, moe_shared_expert_gate (Hugging Face's defaults where not given)."""

    model_type = "qwen3_moe_vha"
    causal_lm_name = "Qwen3MoeVHAForCausalLM"


def fold_refusal(cfg) -> Optional[str]:
    """Why this Qwen3-MoE-VHA model has no exact stock Qwen3-MoE form (Hugging Face Qwen3MoeForCausalLM), or None.

    Gated attention is refused by fold as for dense VHA; here: what stock Qwen3-MoE cannot hold."""
    if cfg.vha_shared_kv:
        return ("vha_shared_kv=true: the folded layer keeps one K = V projection and an inverse RoPE, which stock "
                "Qwen3-MoE has no form for (dense shared-KV VHA folds into Qwen3 shared-KV; there is no MoE "
                "counterpart)")
    if cfg.window_layers():
        return (f"sliding-window layers {cfg.window_layers()[:4]}: Hugging Face's Qwen3-MoE has no per-layer "
                "layer_types, so a mix of window and full layers has no stock Qwen3-MoE form")
    if cfg.has_shared_expert:
        return (f"a shared expert (moe_shared_expert_intermediate_size={cfg.moe_shared_expert_intermediate_size}): "
                "stock Qwen3-MoE has none")
    return None
