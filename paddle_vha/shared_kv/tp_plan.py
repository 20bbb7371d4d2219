"""Tensor-parallel plan of Qwen3 shared-KV: the stock GQA plan (paddle_vha/qwen3/tp_plan.py) over its spec, where
the one K = V projection is split (or replicated) as the keys are (paddle_vha/shared_kv/spec.py)."""
from __future__ import annotations

from ..qwen3.tp_plan import GQAPlan
from ..spec.sharding import TPPlanError
from .spec import KV_PROJECTIONS, QWEN3_SHARED_KV

__all__ = ["check", "layer_plan", "TPPlanError"]

_PLAN = GQAPlan(QWEN3_SHARED_KV, kv_projections=KV_PROJECTIONS)
check, layer_plan = _PLAN.check, _PLAN.layer_plan
