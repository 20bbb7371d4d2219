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

__all__ = ["NEED_BASE", "NEED_FACTOR", "export_memory_need", "available_bytes", "check_memory", "FORMULA"]

NEED_BASE = 0.5e9  # Python, Paddle, PaddleFormers and onnxruntime loaded (0.32 GB), graph building and conversion
NEED_FACTOR = 1.7  # float32 weights: one held copy plus a stage's passing copies (measured <= 1.45x above the base)
FORMULA = f"{NEED_BASE / 1e9:.1f} GB + {NEED_FACTOR:g} x the float32 weights"
# --weights int8 / int4 (paddle_vha/export/quantize.py): the float32 graph held once while onnxruntime's quantizer
# copies a tensor at a time, the largest (the embedding, transposed for a tied head) a few times over. Measured: 2
# layers at Qwen3-0.6B widths, tied (0.75 GB of weights, the largest tensor 0.62 GB): peak RSS 3.86 GB; Qwen3-0.6B
# (2.38 GB, 0.62 GB) exported and then quantized twice in one process by tools/bench_serve_cpu.py: 6.65 GB;
# Qwen3-1.7B GQA-2 (6.53 GB, 1.24 GB) quantized to int8 from its float32 export: 11.8 GB (the rewrites keep the weights
# in the data file until the graph is final, export/lazy_weights.py; holding them inline it passed 24 GB)
QUANT_TENSOR_FACTOR = 6.5
QUANT_FORMULA = f"{NEED_BASE / 1e9:.1f} GB + the float32 weights + {QUANT_TENSOR_FACTOR:g} x the largest tensor"


def export_memory_need(weight_bytes: int, largest_tensor: int = 0, quantized: bool = False) -> int:
    """Bytes of memory an export of `weight_bytes` float32 weights needs (FORMULA; a quantized export also
    QUANT_FORMULA with `largest_tensor` its largest float32 tensor, whichever is more)."""
    need = int(NEED_BASE + NEED_FACTOR * weight_bytes)
    if quantized:
        need = max(need, int(NEED_BASE + weight_bytes + QUANT_TENSOR_FACTOR * largest_tensor))
    return need


def check_memory(weight_bytes: int, what: str, largest_tensor: int = 0, quantized: bool = False) -> int:
    """The need of an export of `weight_bytes`; ExportError (one line) when the machine has less: its available
    memory plus what this process already holds (Python and the libraries, part of the need)."""
    need = export_memory_need(weight_bytes, largest_tensor, quantized)
    free = available_bytes()
    have = None if free is None else free + resident_bytes()
    if have is not None and have < need:
        raise ExportError(f"{what}: the export needs about {need / 1e9:.1f} GB of memory "
                          f"({QUANT_FORMULA if quantized and need > export_memory_need(weight_bytes) else FORMULA}, "
                          f"{weight_bytes / 1e9:.2f} GB of weights); this machine has {have / 1e9:.1f} GB "
                          "(MemAvailable "
                          "and this process)")
    return need
