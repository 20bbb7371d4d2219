"""Tensor-parallel plan of Qwen3 with sinks: the stock GQA plan (paddle_vha/qwen3/tp_plan.py) over its spec, where
the window layers' sinks are split with the query heads (paddle_vha/sinks/spec.py)."""
from __future__ import annotations

from ..qwen3.tp_plan import GQAPlan
from ..spec.sharding import TPPlanError
from .spec import QWEN3_SINKS

__all__ = ["check", "layer_plan", "TPPlanError"]

_PLAN = GQAPlan(QWEN3_SINKS)
check, layer_plan = _PLAN.check, _PLAN.layer_plan
