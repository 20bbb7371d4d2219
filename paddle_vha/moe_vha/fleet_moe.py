"""Upstream PaddleFleet's MoE config and tensor names -> this project's Qwen3-MoE-VHA (tools/import_fleet.py).

Config (PaddleFleet's TransformerConfig / StandardMoERouter fields): `n_routed_experts` is num_experts (`num_experts`
read as well), `num_experts_per_tok`, `moe_intermediate_size`, `norm_topk_prob`, `decoder_sparse_step`,
`mlp_only_layers`, `first_k_dense_replace` (its first k layers dense: added to mlp_only_layers),
`moe_shared_expert_intermediate_size` and `moe_shared_expert_gate` (the shared expert, sigmoid-gated). Routing this
family cannot hold is refused in one line: a `scoring_func` other than softmax, a `topk_method` other than greedy
(noaux_tc's e_score_correction_bias, group-limited routing), `routed_scaling_factor` other than 1, hash routing
(`moe_n_hash_layers`), split-feature routing.

Tensors (after the layer prefix; Paddle [in, out] layout unless --layout hf):
    mlp.gate.weight                              [E, h]       the router, kept as it is (upstream's StandardMoERouter
                                                              creates it [num_experts, hidden] and scores x W^T)
    mlp.experts.{e}.up_gate_proj.weight          [h, 2 I_e]   gate | up halves (--up-gate-order), split and transposed
    mlp.experts.{e}.down_proj.weight             [I_e, h]     transposed
    mlp.grouped_gemm_experts.weight1 / weight2   [E, h, 2 I_e] / [E, I_e, h]: the grouped-GEMM form of the same
    mlp.shared_experts.up_gate_proj.weight, .down_proj.weight, .gate_weight [h, 1]
                                                 -> mlp.shared_expert.{gate,up,down}_proj.weight, shared_expert_gate
"""
from __future__ import annotations

from typing import List, Optional, Tuple

from ..moe.config import MoEFields
from ..vha.config import Qwen3VHAConfig
from .config import Qwen3MoeVHAConfig

__all__ = ["is_moe_config", "translate_moe", "read_config", "plan_header", "IMPORTED", "SHARED_RENAMES",
           "UPSTREAM_MOE_KEYS"]

IMPORTED = (Qwen3VHAConfig, Qwen3MoeVHAConfig)  # what an upstream checkpoint imports as: dense, or with routed experts

UPSTREAM_MOE_KEYS = ("n_routed_experts", "num_experts")
# upstream routing fields -> the value Qwen3-MoE's router has (None = absent is fine too), and why
_MUST_BE = {
    "scoring_func": ("softmax", "Qwen3-MoE's router is a softmax over the experts"),
    "topk_method": ("greedy", "Qwen3-MoE takes the plain top-k (no correction bias, no expert groups)"),
    "routed_scaling_factor": (1.0, "Qwen3-MoE does not scale the routing weights"),
    "routed_scaling_factor_learnable": (False, "Qwen3-MoE does not scale the routing weights"),
    "moe_n_hash_layers": (0, "hash routing is not Qwen3-MoE's"),
    "moe_split_feature_routing": (False, "split-feature (two-view) routing is not Qwen3-MoE's"),
}
# upstream's shared-expert tensor names (after mlp.) -> Hugging Face's (Qwen2-MoE's, which Qwen3-MoE's family reuses)
SHARED_RENAMES = {"shared_experts.down_proj.weight": "shared_expert.down_proj.weight",
                  "shared_experts.gate_weight": "shared_expert_gate.weight"}


def is_moe_config(raw: dict) -> bool:
    return any(raw.get(k) for k in UPSTREAM_MOE_KEYS)


def translate_moe(raw: dict) -> dict:
    """config.json fields with upstream's MoE names replaced by ours (ValueError, one line, for routing Qwen3-MoE has
    no form for)."""
    for name, (want, why) in _MUST_BE.items():
        v = raw.get(name)
        if v is not None and v != want:
            raise ValueError(f"{name}={v!r}: {why}")
    out = {k: v for k, v in raw.items() if k not in _MUST_BE and k not in ("n_routed_experts", "first_k_dense_replace",
                                                                             "n_shared_experts")}
    out["num_experts"] = raw.get("n_routed_experts") or raw.get("num_experts")
    shared = raw.get("n_shared_experts")
    if shared and raw.get("moe_shared_expert_intermediate_size") is None:  # DeepSeek's count of expert-wide ones
        out["moe_shared_expert_intermediate_size"] = shared * raw["moe_intermediate_size"]
    first: Optional[int] = raw.get("first_k_dense_replace")
    if first:
        out["mlp_only_layers"] = sorted(set(raw.get("mlp_only_layers") or []) | set(range(first)))
    return out


def read_config(raw: dict) -> Tuple[type, dict]:
    """(the config class an upstream config.json imports as, its fields in our names): Qwen3-MoE-VHA when it has
    routed experts (upstream's MoE names translated; ValueError, one line, for routing Qwen3-MoE has no form for),
    else Qwen3-VHA with the fields as they are."""
    if is_moe_config(raw):
        return Qwen3MoeVHAConfig, translate_moe(raw)
    return Qwen3VHAConfig, raw


def plan_header(cfg) -> List[str]:
    """The import plan's line on the routed experts and the MoE layers; none for a dense import."""
    if not isinstance(cfg, MoEFields):
        return []
    shared = f", shared expert {cfg.moe_shared_expert_intermediate_size}" if cfg.has_shared_expert else ""
    return [f"{cfg.experts_line()}, MoE layers {cfg.moe_layer_indices}{shared}"]
