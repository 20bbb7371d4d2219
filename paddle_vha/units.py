"""Byte counts and durations for people: one formatter of each for every tool (bytes 1024-based, the VHA article's
units: 4096 B = 4 KB)."""
from __future__ import annotations

import math

__all__ = ["fmt_bytes", "fmt_seconds"]


def fmt_bytes(n: float, fixed: bool = False) -> str:
    """4096 -> '4 KB', 1152 -> '1.12 KB', 3.4e9 -> '3.17 GB'; fixed=True keeps two decimals ('4.00 KB') so that
    columns of sizes line up."""
    for unit, scale in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if n >= scale:
            v = n / scale
            return f"{v:.0f} {unit}" if not fixed and math.isclose(v, round(v)) else f"{v:.2f} {unit}"
    return f"{n:.0f} B"


def fmt_seconds(s: float) -> str:
    """12.3 -> '12 s', 754 -> '12.6 min', 9000 -> '2.5 h', 3e5 -> '3.5 days', 1e9 -> '31.7 years'."""
    for unit, scale in (("years", 365.25 * 86400), ("days", 86400), ("h", 3600), ("min", 60)):
        if s >= scale:
            return f"{s / scale:.3g} {unit}"
    return f"{s:.0f} s"
