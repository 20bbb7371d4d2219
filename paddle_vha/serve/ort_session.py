"""onnxruntime session over an exported decoder (OUT_DIR/model.onnx)."""
from __future__ import annotations

import os

from .session import DecoderSession, ServeError, per_cache_input, read_export_info

__all__ = ["OrtDecoder"]


class OrtDecoder(DecoderSession):
    def __init__(self, onnx_path: str, threads: int = 0):
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.log_severity_level = 3
        if threads:
            opts.intra_op_num_threads = threads
        try:
            self.session = ort.InferenceSession(onnx_path, opts, providers=["CPUExecutionProvider"])
        except Exception as e:  # noqa: BLE001 - onnxruntime raises its own types for unreadable or truncated models
            first = (str(e).strip().splitlines() or [""])[0][:300]
            raise ServeError(f"{onnx_path}: onnxruntime cannot load it ({type(e).__name__}: {first})") from None
        self.inputs = [i.name for i in self.session.get_inputs()]
        self.outputs = [o.name for o in self.session.get_outputs()]
        # [batch, heads, past_sequence, width] per cache input (MEA layers: one wide head)
        self.cache_shapes = [(i.shape[1], i.shape[3]) for i in self.session.get_inputs()[3:]]

    @classmethod
    def from_dir(cls, export_dir: str, threads: int = 0):
        info = read_export_info(export_dir)  # ServeError (one line) for a folder tools/export_onnx.py did not write whole
        session = cls(os.path.join(export_dir, "model.onnx"), threads)
        session.cache_windows = per_cache_input(info, "cache_windows")
        session.cache_io = info["cache_io"]
        return session

    def _run(self, arrays):
        return self.session.run(self.outputs, dict(zip(self.inputs, arrays)))
