"""Which CPU kernel variant the fused prologue runs, and the CPU facts a benchmark header reports.

The op's library exports two C functions (ops/csrc/cpu/op_cpu.cc), read here through ctypes: the variant a call
would run now (the best this CPU has, or VHA_PROLOGUE_ISA's choice) and every variant this CPU can run.
"""
from __future__ import annotations

from .op_loader import FusedPrologueUnavailable, load_error, op_library

__all__ = ["cpu_variant", "cpu_variants", "cpu_model", "cpu_isa_flags"]


def cpu_variant() -> str:
    """The CPU kernel variant the op runs now: "avx512", "avx2" or "baseline" (the best this CPU has, unless
    VHA_PROLOGUE_ISA names another). Raises FusedPrologueUnavailable when VHA_PROLOGUE_ISA asks for one it cannot run."""
    lib = op_library()
    if lib is None:
        raise FusedPrologueUnavailable(f"fused prologue unavailable: {load_error()}")
    said = lib.vha_prologue_cpu_variant().decode()
    if said.startswith("error: "):
        raise FusedPrologueUnavailable(said[len("error: "):].splitlines()[0])
    return said


def cpu_variants() -> list[str]:
    """The CPU kernel variants this CPU can run, best first."""
    lib = op_library()
    return lib.vha_prologue_cpu_variants().decode().split(",") if lib is not None else []


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), for benchmark headers."""
    import platform

    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_isa_flags() -> str:
    """The vector instruction sets this CPU reports that matter to the op's kernels (e.g. "avx2 fma avx512f")."""
    wanted = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512_bf16")
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    have = set(line.split(":", 1)[1].split())
                    return " ".join(w for w in wanted if w in have) or "none of " + " ".join(wanted)
    except OSError:
        pass
    return "unknown"
