"""paddle-vha's onnxruntime custom-op library (ops/ort: DecodeAttention / DecodeAttentionInt8 in domain
ai.paddle_vha, docs/deploy.md "The fused attention op"): built on first use (ops/ort/build.py, from a checkout's ops/
or the wheel's paddle_vha/_ops), registered into onnxruntime SessionOptions. Paddle-free."""
from __future__ import annotations

import ctypes
import importlib.util
from pathlib import Path
from typing import Optional

__all__ = ["DOMAIN", "LIBRARY_FILE", "OrtOpsUnavailable", "library_path", "register", "attention_isa", "uses_library"]

DOMAIN = "ai.paddle_vha"
LIBRARY_FILE = "libpaddle_vha_ort_ops.so"  # its name in an export folder (paddle_vha/export/fused_attention.py)
_built: Optional[Path] = None


class OrtOpsUnavailable(RuntimeError):
    """The library could not be built or loaded (one line: why)."""


def _build_module():
    package = Path(__file__).resolve().parent.parent
    for candidate in (package / "_ops" / "ort", package.parent / "ops" / "ort"):
        if (candidate / "build.py").is_file():
            spec = importlib.util.spec_from_file_location("paddle_vha_ort_build", candidate / "build.py")
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
            return mod
    raise OrtOpsUnavailable("the custom-op library's sources are missing (neither paddle_vha/_ops/ort nor a "
                            "checkout's ops/ort holds build.py)")


def library_path() -> Path:
    """The built library (compiled now on first use; cached by its sources' digest)."""
    global _built
    if _built is None:
        try:
            _built = Path(_build_module().build())
        except OrtOpsUnavailable:
            raise
        except Exception as e:  # noqa: BLE001 - a compiler or download failure: one line for the user
            raise OrtOpsUnavailable(f"building paddle-vha's onnxruntime op library failed: "
                                    f"{str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__}")
    return _built


def register(options) -> None:
    """Registers the library into an onnxruntime.SessionOptions."""
    options.register_custom_ops_library(str(library_path()))


def attention_isa() -> str:
    """The instruction set the attention kernels run now: avx512, avx2 or baseline (VHA_ATTENTION_ISA's choice)."""
    lib = ctypes.CDLL(str(library_path()))
    lib.vha_attention_isa.restype = ctypes.c_char_p
    said = lib.vha_attention_isa().decode()
    if said.startswith("error: "):
        raise OrtOpsUnavailable(said[len("error: "):])
    return said


def uses_library(model_path: str) -> bool:
    """Whether the ONNX model at model_path holds nodes of this library's domain (reads the graph, not the weights)."""
    import onnx

    model = onnx.load(model_path, load_external_data=False)
    return any(op.domain == DOMAIN for op in model.opset_import)
