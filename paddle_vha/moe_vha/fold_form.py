"""What a Qwen3-MoE-VHA checkpoint folds into (paddle_vha/transform/fold.py asks it): stock Qwen3-MoE, its attention
folded as Qwen3-VHA's (paddle_vha/vha/fold_form.py, the spec's fold roles), its router and experts copied. Refused:
what stock Qwen3-MoE cannot hold (fold_refusal in config.py), then what dense VHA's fold refuses. --verify runs both
checkpoints through the float64 numpy forward (no Paddle model of either)."""
from __future__ import annotations

from typing import List, Mapping, Optional

from ..moe.config import Qwen3MoeConfig
from ..vha.fold_form import VHAFold
from .config import fold_refusal

__all__ = ["MoEVHAFold", "MOE_VHA_FOLD"]


class MoEVHAFold(VHAFold):
    # keys of a Qwen3-MoE-VHA config.json stock Qwen3-MoE does not have (a shared expert is refused before this)
    drop_keys = VHAFold.drop_keys + ("moe_shared_expert_intermediate_size", "moe_shared_expert_gate")
    verify_numpy = True

    def refusal(self, cfg) -> Optional[str]:
        return fold_refusal(cfg) or super().refusal(cfg)

    def target(self, raw: Mapping) -> str:
        return self.into  # stock Qwen3-MoE whatever the attention options (the refusals say which have no form)

    def extra_header(self, cfg) -> List[str]:
        return [f"{cfg.experts_line()}; MoE layers {cfg.moe_layer_indices}: router and experts copied"]


MOE_VHA_FOLD = MoEVHAFold(Qwen3MoeConfig.model_type)
