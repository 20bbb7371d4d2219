"""Paddle Inference predictor over the exported static program (EXPORT_DIR/paddle/model.{json,pdiparams})."""
from __future__ import annotations

import os

from .session import DecoderSession, ServeError, per_cache_input, read_export_info

__all__ = ["PaddleInferenceDecoder"]


class PaddleInferenceDecoder(DecoderSession):
    def __init__(self, export_dir: str, threads: int = 1):
        from paddle import inference

        info = read_export_info(export_dir)  # the static program's input shapes are not queryable before a run
        if info["kv_cache"]["format"] != "fp32":
            raise ServeError(f"{export_dir}: its model.onnx keeps the KV cache in {info['kv_cache']['format']} "
                             "(onnxruntime's MatMulIntegerToFloat), and paddle/ holds the float32-cache program: "
                             "Paddle Inference runs an export without --kv-cache (or run this one with onnxruntime)")
        prefix = os.path.join(export_dir, "paddle", "model")
        for ext in (".json", ".pdiparams"):
            if not os.path.isfile(prefix + ext):
                raise ServeError(f"{prefix + ext}: missing (the export's Paddle program)")
        config = inference.Config(prefix + ".json", prefix + ".pdiparams")
        config.disable_gpu()
        # oneDNN, on by default on CPU, silently computed wrong results for a graph taking cos and sin of the same
        # tensor (docs/deploy.md); the plain CPU kernels are exact. tests/test_export_serve.py pins parity.
        config.disable_mkldnn()
        config.set_cpu_math_library_num_threads(threads)
        config.disable_glog_info()
        try:
            self.predictor = inference.create_predictor(config)
        except Exception as e:  # noqa: BLE001 - Paddle raises its own types for a truncated or foreign program
            said = [ln.strip() for ln in str(e).strip().splitlines() if ln.strip()]
            hint = next((ln for ln in said if ln.startswith("[Hint")), said[-1] if said else "")
            raise ServeError(f"{prefix}.json / .pdiparams: Paddle Inference cannot load them ({type(e).__name__}: "
                             f"{hint[:300]})") from None
        self.inputs = self.predictor.get_input_names()
        self.outputs = self.predictor.get_output_names()
        self.cache_shapes = [tuple(s) for s in per_cache_input(info, "cache_shapes")]
        self.cache_windows = per_cache_input(info, "cache_windows")
        self.cache_io = info["cache_io"]

    def _run(self, arrays):
        for name, value in zip(self.inputs, arrays):
            handle = self.predictor.get_input_handle(name)
            handle.reshape(list(value.shape))
            handle.copy_from_cpu(value)
        self.predictor.run()
        return [self.predictor.get_output_handle(n).copy_to_cpu() for n in self.outputs]
