"""Qwen3 with sinks in the cost model (paddle_vha/accounting.py): stock GQA; a sink is H numbers per window layer and
one term per query in the softmax, nothing the byte / FLOP formulas count."""
from __future__ import annotations

from ..qwen3.cost import arch_fields

__all__ = ["arch_fields"]
