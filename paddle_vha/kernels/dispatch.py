"""The fused prologue's dispatch policy: whether a layer call uses the op or the composed path.

`Qwen3VHAConfig.vha_fused_prologue` is the flag: None (default) uses the op where it builds, loads, runs on the
input's device and is measured faster than the composed path, and falls back with one logged line otherwise; True
requires it (an error if it is unavailable); False always uses the composed path, which stays the reference.
"""
from __future__ import annotations

import logging

import paddle

from .cpu_variant import cpu_variant
from .op_loader import FusedPrologueUnavailable, load_error, load_op

__all__ = ["should_use_fused", "fused_unavailable_reason", "fused_not_faster_reason"]

_LOG = logging.getLogger(__name__)
_warned: set = set()  # the fallback reasons already logged (each once per process)

# Where the CPU kernels are measured faster than the composed path (docs/prologue.md, "Which path runs"): every
# variant on x86-64 (avx512, avx2 and the SSE2 baseline, at S = 1 ... 8192, forward and forward + backward).
_MEASURED_FASTER_ON = ("x86_64", "amd64")


def _on_cpu(x: paddle.Tensor | None) -> bool:
    if x is not None and paddle.in_dynamic_mode():
        return x.place.is_cpu_place()
    return paddle.get_device() == "cpu"


def _on_gpu(x: paddle.Tensor | None) -> bool:
    if x is not None and paddle.in_dynamic_mode():
        return x.place.is_gpu_place()
    return paddle.get_device().startswith("gpu")


@paddle.jit.not_to_static  # plain Python under to_static: it only picks and calls the op
def fused_unavailable_reason(x: paddle.Tensor | None = None) -> str | None:
    """Why the fused op cannot run (for tensor x's device, if given), or None when it can."""
    if x is not None and paddle.in_dynamic_mode():
        place = x.place
        if not (place.is_cpu_place() or (place.is_gpu_place() and paddle.is_compiled_with_cuda())):
            return f"no kernel for place {place}"
    if x is not None and x.dtype not in (paddle.float32, paddle.float64, paddle.bfloat16, paddle.float16):
        return f"unsupported dtype {x.dtype}"
    if load_op() is None:
        return load_error() or "operator not loaded"
    if _on_cpu(x):
        try:
            cpu_variant()
        except FusedPrologueUnavailable as e:  # VHA_PROLOGUE_ISA names a variant this CPU cannot run
            return str(e)
    return None


def fused_not_faster_reason(x: paddle.Tensor | None = None) -> str | None:
    """Why the default (vha_fused_prologue=None) keeps the composed path although the op runs, or None."""
    import platform

    if _on_gpu(x):  # docs/prologue.md: the kernels passed tools/gpu_check.py on an H200, the Paddle op never ran there
        return ("its Paddle CUDA op has never run on a GPU (the kernels passed tools/gpu_check.py on an H200 through "
                "PyTorch, with no Paddle GPU build there: docs/prologue.md; set vha_fused_prologue=True to use them)")
    machine = platform.machine().lower()
    if _on_cpu(x) and machine not in _MEASURED_FASTER_ON:
        return (f"its CPU kernels are not measured faster than the composed path on {machine} "
                "(set vha_fused_prologue=True to use them)")
    return None


def _warn_once(message: str, reason: str) -> None:
    if reason not in _warned:
        _warned.add(reason)
        _LOG.warning(message, reason)


@paddle.jit.not_to_static  # plain Python under to_static: it only picks and calls the op
def should_use_fused(flag, x: paddle.Tensor) -> bool:
    """Dispatch decision for config.vha_fused_prologue = flag (None / True / False) and input x: None uses the op
    where it runs and is measured faster than the composed path, True requires it, False never uses it. Every
    decision to fall back is logged once, in one line."""
    if flag is False:
        return False
    reason = fused_unavailable_reason(x)
    if reason is None:
        if flag is True:
            return True
        slower = fused_not_faster_reason(x)
        if slower is None:
            return True
        _warn_once("fused VHA prologue not used: %s; using the composed path", slower)
        return False
    if flag is True:
        raise FusedPrologueUnavailable(f"vha_fused_prologue=True but the fused prologue is unavailable: {reason}")
    _warn_once("fused VHA prologue unavailable (%s); using the composed path", reason)
    return False
