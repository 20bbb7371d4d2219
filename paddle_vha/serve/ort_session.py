"""onnxruntime session over an exported decoder (OUT_DIR/model.onnx)."""
from __future__ import annotations

import os

from .kv_cache import slots_from_inputs
from .session import DecoderSession, ServeError, per_cache_input, read_export_info

__all__ = ["OrtDecoder"]


def _uses_custom_ops(folder: str) -> bool:
    """export_info.json's attention_op says the graph holds nodes of paddle-vha's onnxruntime library (absent: no)."""
    import json

    try:
        with open(os.path.join(folder, "export_info.json"), encoding="utf-8") as f:
            return (json.load(f).get("attention_op") or {}).get("op") == "fused"
    except (OSError, ValueError):
        return False


class OrtDecoder(DecoderSession):
    """threads: onnxruntime's intra-op threads (0: its default, one per physical core). spin: let idle intra-op
    threads busy-wait between ops (onnxruntime's default; spin=False turns it off: session.intra_op.allow_spinning
    0). Whether off is faster on a shared 2-core VM was not settled: interleaved A/B rounds of the Qwen3-0.6B int4
    export under load averages 4-10 varied 2-4x from round to round, either way (docs/deploy.md)."""

    def __init__(self, onnx_path: str, threads: int = 0, spin: bool = True, profile: str = "",
                 custom_ops: bool = None):
        import onnxruntime as ort

        opts = ort.SessionOptions()
        if custom_ops is None:  # an export folder says whether its graph holds paddle-vha's own ops (a model given
            # as bytes: no folder, no library unless asked for)
            custom_ops = isinstance(onnx_path, str) and _uses_custom_ops(os.path.dirname(os.path.abspath(onnx_path)))
        if custom_ops:
            from .ort_ops import LIBRARY_FILE, OrtOpsUnavailable, register

            shipped = os.path.join(os.path.dirname(os.path.abspath(onnx_path)), LIBRARY_FILE) \
                if isinstance(onnx_path, str) else ""
            try:
                if shipped and os.path.isfile(shipped):  # the export folder's copy: no compiler needed where it is served
                    opts.register_custom_ops_library(shipped)
                else:
                    register(opts)
            except OrtOpsUnavailable as e:
                raise ServeError(f"{onnx_path} was exported with --attention-op fused and needs paddle-vha's "
                                 f"onnxruntime op library: {e}") from None
        opts.log_severity_level = 3
        if profile:  # onnxruntime's profiler: a JSON trace named PROFILE_<date>.json, written by end_profiling()
            opts.enable_profiling = True
            opts.profile_file_prefix = profile
        if threads:
            opts.intra_op_num_threads = threads
        if not spin:
            opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        try:
            self.session = ort.InferenceSession(onnx_path, opts, providers=["CPUExecutionProvider"])
        except Exception as e:  # noqa: BLE001 - onnxruntime raises its own types for unreadable or truncated models
            first = (str(e).strip().splitlines() or [""])[0][:300]
            raise ServeError(f"{onnx_path}: onnxruntime cannot load it ({type(e).__name__}: {first})") from None
        self.inputs = [i.name for i in self.session.get_inputs()]
        self.outputs = [o.name for o in self.session.get_outputs()]
        # [batch, heads, past_sequence, width] per float32 cache input (MEA layers: one wide head); the int8 cache's
        # tensors (keys transposed, scales) as the graph declares them (paddle_vha/serve/kv_cache.py)
        args = self.session.get_inputs()[3:]
        self.cache_shapes = [(i.shape[1], i.shape[3]) for i in args]
        try:
            self.cache_slots = slots_from_inputs(args)
        except ValueError as e:
            raise ServeError(f"{onnx_path}: {e}") from None

    @classmethod
    def from_dir(cls, export_dir: str, threads: int = 0, spin: bool = True, profile: str = ""):
        info = read_export_info(export_dir)  # ServeError (one line) for a folder tools/export_onnx.py did not write whole
        session = cls(os.path.join(export_dir, "model.onnx"), threads, spin, profile)
        session.cache_windows = per_cache_input(info, "cache_windows")
        session.cache_io = info["cache_io"]
        return session

    def _run(self, arrays):
        return self.session.run(self.outputs, dict(zip(self.inputs, arrays)))
