"""What this machine can give a tool, read from /proc (Linux): the memory available to allocate, and this process's
resident memory. Every tool that refuses a job up front for want of memory asks here."""
from __future__ import annotations

from typing import Optional

__all__ = ["available_memory_bytes", "resident_bytes", "shortfall_line"]


def _proc_field(path: str, key: str) -> Optional[int]:
    """A "Key:   123 kB" line of a /proc file, in bytes; None where the file or the line is missing."""
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def available_memory_bytes() -> Optional[int]:
    """MemAvailable of /proc/meminfo (what can be allocated without swapping), or None where unknown (not Linux)."""
    return _proc_field("/proc/meminfo", "MemAvailable")


def resident_bytes() -> int:
    """This process's resident memory (VmRSS), 0 where unknown."""
    return _proc_field("/proc/self/status", "VmRSS") or 0


def shortfall_line(need: int, have: Optional[int], what: str, verb: str, hint: str) -> Optional[str]:
    """The one-line refusal every tool gives when MemAvailable (`have`, None where unknown) is below `need` bytes, or
    None when the need fits; `what` says where the need comes from, `hint` what the user can lower."""
    if have is None or have >= need:
        return None
    from .units import fmt_bytes

    return (f"needs about {fmt_bytes(need)} of memory ({what}), but MemAvailable is {fmt_bytes(have)}; "
            f"refusing to {verb} ({hint})")
