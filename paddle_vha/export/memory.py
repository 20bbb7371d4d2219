"""How much memory an export needs, and the up-front refusal when the machine does not have it.

The export holds one float32 copy of the weights at a time at each of its stages (the decoder being saved, the
reference model, the onnxruntime session), plus a stage's passing copies and the processes' own size. Measured peak
RSS (/usr/bin/time -v, docs/deploy.md): 0.40 GB for a toy model, 2.66 GB for 2 layers at Qwen3-0.6B widths (1.37 GB
of weights), 3.78 GB for Qwen3-0.6B (2.38 GB; 1.58x), either cache flavour, 8.98 GB for Qwen3-1.7B (6.88 GB;
1.30x). The need is stated as `NEED_BASE + NEED_FACTOR x` the float32 weights, an upper bound of those measurements.
"""
from __future__ import annotations

from ..machine import available_memory_bytes as available_bytes
from ..machine import resident_bytes
from .errors import ExportError

__all__ = ["NEED_BASE", "NEED_FACTOR", "export_memory_need", "available_bytes", "check_memory", "FORMULA",
           "QUANT_FORMULA"]

NEED_BASE = 0.5e9  # Python, Paddle, PaddleFormers and onnxruntime loaded (0.32 GB), graph building and conversion
NEED_FACTOR = 1.7  # float32 weights: one held copy plus a stage's passing copies (measured <= 1.45x above the base)
FORMULA = f"{NEED_BASE / 1e9:.1f} GB + {NEED_FACTOR:g} x the float32 weights"
# --weights int8 / int4 (paddle_vha/export/quantize.py): the float32 stages, then the quantization, which reads one
# weight at a time from model.onnx.data (the LM head 64 MB of columns at a time) and holds the quantized weights and, at
# the end, the float32 embedding the Gather keeps. Measured peak RSS (docs/reliability.md, one export at a time,
# KiB x 1024): Qwen3-0.6B (2.38 GB of float32 weights, the largest tensor 0.62 GB) int8 4.47 GB, int4 4.32 GB,
# fp32 3.86 GB;
# Qwen3-1.7B (6.88 GB, 1.24 GB) int8 9.25 GB, int4 9.23 GB, fp32 9.15 GB (its float32 validation is the peak). Before
# (onnxruntime's MatMulNBitsQuantizer over the whole float32 graph in memory) Qwen3-0.6B int8 peaked at 6.89 GB, and
# the need was 0.5 GB + the weights + 6.5 x the largest tensor.
QUANT_FORMULA = f"{FORMULA} + the largest tensor"


def export_memory_need(weight_bytes: int, largest_tensor: int = 0, quantized: bool = False) -> int:
    """Bytes of memory an export of `weight_bytes` float32 weights needs (FORMULA; a quantized export also
    `largest_tensor`, its largest float32 tensor: QUANT_FORMULA)."""
    return int(NEED_BASE + NEED_FACTOR * weight_bytes + (largest_tensor if quantized else 0))


def check_memory(weight_bytes: int, what: str, largest_tensor: int = 0, quantized: bool = False) -> int:
    """The need of an export of `weight_bytes`; ExportError (one line) when the machine has less: its available
    memory plus what this process already holds (Python and the libraries, part of the need)."""
    need = export_memory_need(weight_bytes, largest_tensor, quantized)
    free = available_bytes()
    have = None if free is None else free + resident_bytes()
    if have is not None and have < need:
        raise ExportError(f"{what}: the export needs about {need / 1e9:.1f} GB of memory "
                          f"({QUANT_FORMULA if quantized else FORMULA}, "
                          f"{weight_bytes / 1e9:.2f} GB of weights); this machine has {have / 1e9:.1f} GB "
                          "(MemAvailable "
                          "and this process)")
    return need
