"""What this machine can give a tool, read from /proc (Linux): the memory available to allocate, and this process's
resident memory (every tool that refuses a job up front for want of memory asks here); and for the benchmarks, the CPU
in one line, and the copy and read bandwidths their floors are measured against."""
from __future__ import annotations

import os
import time
from typing import Optional

__all__ = ["available_memory_bytes", "resident_bytes", "shortfall_line", "cpu_line", "copy_bandwidth", "read_bandwidth",
           "gemm_gflops"]


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


def cpu_line() -> str:
    """"<model name>, <cores> cores, <widest x86 vector ISA>" from /proc/cpuinfo: the line a benchmark's table opens
    with (machines here differ)."""
    model, flags = "?", set()
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("model name") and model == "?":
                    model = line.split(":", 1)[1].strip()
                elif line.startswith("flags") and not flags:
                    flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    isa = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "no AVX2"
    return f"{model}, {os.cpu_count()} cores, {isa}"


def copy_bandwidth(mb: int = 256, repeats: int = 7) -> float:
    """Bytes moved (read + written) per second by a large numpy copy on this machine, now, best of `repeats` after one
    untimed copy (the first touches fresh pages): the yardstick of the benchmarks' floors."""
    import numpy as np

    a = np.ones(mb * 2**20 // 4, np.float32)
    b = np.empty_like(a)
    np.copyto(b, a)
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        np.copyto(b, a)
        best = min(best, time.perf_counter() - t)
    return 2 * a.nbytes / best


def read_bandwidth(mb: int = 256, repeats: int = 7, threads: Optional[int] = None) -> float:
    """Bytes read per second from a large array on this machine, now: a numpy reduction (bitwise OR over int64 words,
    the cheapest one numpy has: the read is all it does) over `mb` MB, split over `threads` threads (default: the CPUs
    this process may run on; numpy releases the GIL in reductions), best of `repeats` after one untimed pass, and the
    best of that and one thread. A decode step mostly reads (weights, cache), so its floor is its bytes over this:
    a copy (copy_bandwidth) also writes, and a step's reads can run faster than the copy's rate (docs/deploy.md)."""
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np

    words = np.ones(mb * 2**20 // 8, np.int64)
    n = max(1, threads or len(os.sched_getaffinity(0)))
    parts = np.array_split(words, n)
    best = float("inf")
    with ThreadPoolExecutor(n) as pool:
        for run in (lambda: list(pool.map(np.bitwise_or.reduce, parts)), lambda: np.bitwise_or.reduce(words)):
            run()
            for _ in range(repeats):
                t = time.perf_counter()
                run()
                best = min(best, time.perf_counter() - t)
    return words.nbytes / best


def gemm_gflops(m: int = 512, k: int = 1024, n: int = 1024, seconds: float = 0.3) -> Optional[float]:
    """Float32 GEMM GFLOP/s this process gets from Paddle, measured now: (m x k) @ (k x n) repeated for about
    `seconds` (the first call, warm-up, not counted). None where Paddle cannot run it."""
    try:
        import paddle

        a, b = paddle.rand([m, k], dtype="float32"), paddle.rand([k, n], dtype="float32")
        paddle.matmul(a, b).numpy()
        runs, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            paddle.matmul(a, b).numpy()
            runs += 1
        return 2 * m * k * n * runs / (time.perf_counter() - start) / 1e9
    except Exception:  # noqa: BLE001 - an estimate's input: none rather than a failure
        return None
