"""Byte counts for people: one formatter for every tool (1024-based, the VHA article's units: 4096 B = 4 KB)."""
from __future__ import annotations

import math

__all__ = ["fmt_bytes"]


def fmt_bytes(n: float, fixed: bool = False) -> str:
    """4096 -> '4 KB', 1152 -> '1.12 KB', 3.4e9 -> '3.17 GB'; fixed=True keeps two decimals ('4.00 KB') so that
    columns of sizes line up."""
    for unit, scale in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if n >= scale:
            v = n / scale
            return f"{v:.0f} {unit}" if not fixed and math.isclose(v, round(v)) else f"{v:.2f} {unit}"
    return f"{n:.0f} B"
