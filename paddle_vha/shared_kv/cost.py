"""Qwen3 shared-KV in the cost model (paddle_vha/accounting.py): GQA whose cache holds one tensor per layer (the
stock formulas read `kv_projections`: the spec's one projection, one cached tensor)."""
from __future__ import annotations

from ..qwen3.cost import arch_fields as stock_fields
from .spec import KV_PROJECTIONS

__all__ = ["arch_fields"]


def arch_fields(cfg: dict, common: dict) -> dict:
    return dict(stock_fields(cfg, common), kv_projections=KV_PROJECTIONS)
