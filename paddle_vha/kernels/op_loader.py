"""Build and load of the fused VHA prologue custom operator, from ops/ of a checkout or an installed wheel's copy.

load_op() builds the op on first use (ops/build.py, quietly; its output is kept for the error) and returns the loaded
module, or None with the reason kept (load_error()); op_library() is the same shared library as a ctypes handle, for
the C functions it exports besides the operator (cpu_variant.py).
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

__all__ = ["load_op", "load_error", "op_library", "ops_source_dir", "build_script", "FusedPrologueUnavailable"]

_lock = threading.Lock()
_state = {"tried": False, "mod": None, "error": None}  # one build / load attempt per process, and its outcome


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
    """ops/build.py (or the wheel's copy) as a module: build(), build_dir(), main(), MODULE_NAME."""
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


def load_error() -> str | None:
    """Why load_op() returned None ("ExceptionType: first line"), or None while it has not failed."""
    return _state["error"]


def op_library():
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
