"""Fused VHA prologue: loader, dispatch and the call into the custom operator built from ops/csrc.

One operator does what the layer's composed path does in five passes over memory:

    q = premix(q_phys, W)  ->  q_norm  ->  RoPE        (B, S, H_p, r) -> (B, H_v, S, d)   [heads_first]
    k = k                  ->  k_norm  ->  RoPE        (B, S, H_kv, d) -> (B, H_kv, S, d)

with Qwen3's rotate-half RoPE from the (B, S, d) cos/sin tables of Qwen3RotaryEmbedding; backward gives
gradients for q_phys, k, the Premix weight and both norm weights. See docs/prologue.md.

`Qwen3VHAConfig.vha_fused_prologue` selects it: None (default) uses the op when it builds and loads and falls
back to the composed path with one logged line otherwise; True requires it (an error if it is unavailable);
False always uses the composed path, which stays the reference.
"""
from __future__ import annotations

import contextlib
import importlib.util
import io
import logging
import threading
import warnings
from pathlib import Path

import paddle

__all__ = ["fused_prologue", "load_op", "ops_source_dir", "fused_unavailable_reason", "should_use_fused",
           "FusedPrologueUnavailable", "fused_not_faster_reason", "cpu_variant", "cpu_variants", "cpu_model", "cpu_isa_flags"]

_LOG = logging.getLogger(__name__)
_lock = threading.Lock()
_state = {"tried": False, "mod": None, "error": None, "warned": set()}


class FusedPrologueUnavailable(RuntimeError):
    """vha_fused_prologue=True but the operator cannot be built or loaded here."""


def ops_source_dir() -> Path | None:
    """The operator's sources: ops/ of a checkout (editable installs too), or the copy an installed wheel carries as
    package data (paddle_vha/_ops, put there by setup.py); None if neither is present."""
    package = Path(__file__).resolve().parent.parent  # paddle_vha/
    for candidate in (package / "_ops", package.parent / "ops"):
        if (candidate / "build.py").is_file():
            return candidate
    return None


def build_script():
    spec = importlib.util.spec_from_file_location("paddle_vha_ops_build", ops_source_dir() / "build.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@contextlib.contextmanager
def _quiet():
    """Silence Python warnings, logging and file descriptors 1/2 (subprocesses too); yield a reader of the text."""
    import os
    import sys
    import tempfile

    sys.stdout.flush()
    sys.stderr.flush()
    with tempfile.TemporaryFile(mode="w+b") as sink, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        saved = [os.dup(1), os.dup(2)]
        previous = logging.root.manager.disable
        logging.disable(logging.INFO)
        os.dup2(sink.fileno(), 1)
        os.dup2(sink.fileno(), 2)

        def said() -> str:
            sys.stdout.flush()
            sys.stderr.flush()
            sink.seek(0)
            return sink.read().decode(errors="replace")

        try:
            with contextlib.redirect_stdout(io.StringIO()):
                yield said
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)
            logging.disable(previous)


@paddle.jit.not_to_static  # plain Python under to_static: it only picks and calls the op
def load_op():
    """The loaded op module (building it on first use if needed), or None with the reason kept."""
    with _lock:
        if not _state["tried"]:
            _state["tried"] = True
            try:
                if ops_source_dir() is None:
                    raise FileNotFoundError("the operator's sources are missing (neither paddle_vha/_ops nor a "
                                            "checkout's ops/ holds build.py)")
                build = build_script()
                # Paddle's loader is chatty (ccache warning, INFO lines, a build subprocess writing to the
                # terminal): keep start-up quiet, and keep what it said for the error message.
                with _quiet() as said:
                    try:
                        _state["mod"] = build.build()
                    except Exception as e:
                        tail = " | ".join(said().strip().splitlines()[-3:])
                        raise type(e)(f"{e} {tail}".strip()) from e
            except Exception as e:  # noqa: BLE001 - any failure means "not available", reported once
                first = (str(e).strip().splitlines() or [""])[0]
                _state["error"] = f"{type(e).__name__}: {first[:400]}"
        return _state["mod"]


def _op_library():
    """ctypes handle of the loaded op's shared library (the same copy Paddle loaded), or None."""
    import ctypes

    if load_op() is None:
        return None
    if "lib" not in _state:
        path = None
        try:
            with open("/proc/self/maps") as f:
                for line in f:
                    if line.rstrip().endswith("vha_prologue_ops.so"):
                        path = line.split(None, 5)[-1].strip()
                        break
        except OSError:
            pass
        if path is None:
            build = build_script()
            path = str(build.build_dir() / build.MODULE_NAME / f"{build.MODULE_NAME}.so")
        lib = ctypes.CDLL(path)
        for name in ("vha_prologue_cpu_variant", "vha_prologue_cpu_variants"):
            getattr(lib, name).restype = ctypes.c_char_p
        _state["lib"] = lib
    return _state["lib"]


def cpu_variant() -> str:
    """The CPU kernel variant the op runs now: "avx512", "avx2" or "baseline" (the best this CPU has, unless
    VHA_PROLOGUE_ISA names another). Raises FusedPrologueUnavailable when VHA_PROLOGUE_ISA asks for one it cannot run."""
    lib = _op_library()
    if lib is None:
        raise FusedPrologueUnavailable(f"fused prologue unavailable: {_state['error']}")
    said = lib.vha_prologue_cpu_variant().decode()
    if said.startswith("error: "):
        raise FusedPrologueUnavailable(said[len("error: "):].splitlines()[0])
    return said


def cpu_variants() -> list[str]:
    """The CPU kernel variants this CPU can run, best first."""
    lib = _op_library()
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
        return _state["error"] or "operator not loaded"
    if _on_cpu(x):
        try:
            cpu_variant()
        except FusedPrologueUnavailable as e:  # VHA_PROLOGUE_ISA names a variant this CPU cannot run
            return str(e)
    return None


def _on_cpu(x: paddle.Tensor | None) -> bool:
    if x is not None and paddle.in_dynamic_mode():
        return x.place.is_cpu_place()
    return paddle.get_device() == "cpu"


# Where the CPU kernels are measured faster than the composed path (docs/prologue.md, "Which path runs"): every
# variant on x86-64 (avx512, avx2 and the SSE2 baseline, at S = 1 ... 8192, forward and forward + backward).
_MEASURED_FASTER_ON = ("x86_64", "amd64")


def _on_gpu(x: paddle.Tensor | None) -> bool:
    if x is not None and paddle.in_dynamic_mode():
        return x.place.is_gpu_place()
    return paddle.get_device().startswith("gpu")


def fused_not_faster_reason(x: paddle.Tensor | None = None) -> str | None:
    """Why the default (vha_fused_prologue=None) keeps the composed path although the op runs, or None."""
    import platform

    if _on_gpu(x):  # docs/prologue.md: no GPU run of tools/gpu_check.py is recorded yet
        return ("its CUDA kernels have no recorded GPU run faster than the composed path (docs/prologue.md; "
                "set vha_fused_prologue=True to use them)")
    machine = platform.machine().lower()
    if _on_cpu(x) and machine not in _MEASURED_FASTER_ON:
        return (f"its CPU kernels are not measured faster than the composed path on {machine} "
                "(set vha_fused_prologue=True to use them)")
    return None


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
        if slower not in _state["warned"]:
            _state["warned"].add(slower)
            _LOG.warning("fused VHA prologue not used: %s; using the composed path", slower)
        return False
    if flag is True:
        raise FusedPrologueUnavailable(f"vha_fused_prologue=True but the fused prologue is unavailable: {reason}")
    if reason not in _state["warned"]:
        _state["warned"].add(reason)
        _LOG.warning("fused VHA prologue unavailable (%s); using the composed path", reason)
    return False


@paddle.jit.not_to_static  # plain Python under to_static: it only picks and calls the op
def fused_prologue(q_phys, k, premix_weight, q_norm_weight, k_norm_weight, cos, sin, eps: float,
                   heads_first: bool = True):
    """Premix -> q_norm / k_norm -> RoPE in one op.

    q_phys (B, S, H_p, r), k (B, S, H_kv, d), premix_weight (H_kv, r, d), norm weights (d,), cos/sin (B or 1, S, d).
    Returns q (B, H_v, S, d) and k (B, H_kv, S, d) with heads_first (the attention layout), else (B, S, H, d).
    Every input is cast to q_phys's dtype (as the composed path's tables already are).
    """
    mod = load_op()
    if mod is None:
        raise FusedPrologueUnavailable(f"fused prologue unavailable: {_state['error']}")
    dt = q_phys.dtype
    args = [t if t.dtype == dt else t.astype(dt) for t in (k, premix_weight, q_norm_weight, k_norm_weight, cos, sin)]
    q_out, k_out = mod.vha_prologue(q_phys, *args, float(eps), bool(heads_first))
    return q_out, k_out
