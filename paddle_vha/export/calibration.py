"""Activation statistics of a float32 decoder on calibration text: what activation-aware quantization weighs by.

For every MatMul whose right operand is a constant weight (K, N), the mean square of each of its K inputs over the
calibration tokens, E[x_k^2]: an error in W[k, :] moves the output by x_k times it, so a block's squared error
weighted by E[x_k^2] is the output's expected squared error from that block (the diagonal of E[x x^T]: what
llama.cpp's imatrix collects and AWQ's scale search reads). Collected by running the exported float32 graph itself
(onnxruntime, prefill over a few windows) with those activations added as graph outputs, so the statistics are of the
very tensors the quantized MatMuls will read. Keyed by the activation's name: MatMuls that share an input (q / k / v,
gate / up, merged later into one) share its statistics.
"""
from __future__ import annotations

import os
import tempfile
from typing import Dict

import numpy as np

__all__ = ["activation_importance", "weight_matmul_inputs", "text_importance", "CALIBRATION_BATCHES",
           "CALIBRATION_WINDOW"]

# what the export calibrates on: CALIBRATION_BATCHES x 4 windows of CALIBRATION_WINDOW tokens of the calibration
# text's calibration part (SmolLM2-135M: 4,096 tokens in ~13 s)
CALIBRATION_BATCHES, CALIBRATION_WINDOW = 4, 256


def weight_matmul_inputs(graph) -> Dict[str, str]:
    """{activation name: the name of one weight it multiplies} for every MatMul of `graph` reading a 2-D constant
    (directly, or through Transpose nodes: a tied LM head)."""
    inits = {t.name: t for t in graph.initializer}
    made = {o: n for n in graph.node for o in n.output}
    out = {}
    for n in graph.node:
        if n.op_type != "MatMul" or len(n.input) != 2:
            continue
        src = n.input[1]
        while src in made and made[src].op_type == "Transpose":
            src = made[src].input[0]
        if src in inits and len(inits[src].dims) == 2:
            out.setdefault(n.input[0], src)
    return out


def _stub_head(graph) -> None:
    """The LM head's MatMul (the one the logits output comes from) given a (K, 1) zero weight in this probe: its input
    is what calibration reads, its (B, S, V) product nobody does (at a 151,936-token vocabulary it was most of the
    calibration's time). Everything else, the caches included, computes as in the graph."""
    from onnx import numpy_helper

    made = {o: n for n in graph.node for o in n.output}
    inits = {t.name: t for t in graph.initializer}
    node = made.get(graph.output[0].name)
    while node is not None and node.op_type != "MatMul":
        node = made.get(node.input[0]) if node.input else None
    if node is None:
        return
    src, flips = node.input[1], 0
    while src in made and made[src].op_type == "Transpose":
        src, flips = made[src].input[0], flips + 1
    if src not in inits or len(inits[src].dims) != 2:
        return
    k = int(inits[src].dims[flips % 2])
    stub = numpy_helper.from_array(np.zeros((k, 1), np.float32), name=node.input[1] + ".calibration_stub")
    graph.initializer.append(stub)
    node.input[1] = stub.name


def activation_importance(onnx_path: str, ids: np.ndarray, cache_windows, cache_io: str,
                          chunk: int = 2) -> Dict[str, np.ndarray]:
    """{activation name: (K,) float64 E[x_k^2]} over the prefill of every row of `ids` (B, S), `chunk` rows at a
    time, through the float32 graph at `onnx_path` (its weights read where they are: inline, or the folder's
    model.onnx.data)."""
    import onnx
    from onnx import TensorProto, helper

    from ..serve.ort_session import OrtDecoder

    folder = os.path.dirname(onnx_path) or "."
    model = onnx.load(onnx_path, load_external_data=False)
    names = sorted(weight_matmul_inputs(model.graph))
    base = [o.name for o in model.graph.output]
    for name in names:
        model.graph.output.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, None))
    _stub_head(model.graph)
    external = any(t.data_location == TensorProto.EXTERNAL for t in model.graph.initializer)
    probe_path = None
    try:
        if external:  # the graph alone, beside model.onnx.data (its references resolve from this folder)
            fd, probe_path = tempfile.mkstemp(suffix=".onnx", prefix=".calibration-", dir=folder)
            os.close(fd)
            onnx.save_model(model, probe_path)
            source = probe_path
        else:  # inline weights (a model under 2 GB): handed to onnxruntime as bytes, no copy on disk
            source = model.SerializeToString()
        del model

        class _Probe(OrtDecoder):
            captured = None

            def _run(self, arrays):
                got = self.session.run(self.outputs, dict(zip(self.inputs, arrays)))
                _Probe.captured = got[len(base):]
                return got[:len(base)]

        session = _Probe(source)
        del source
        session.outputs = base + names
        session.cache_windows, session.cache_io = cache_windows, cache_io
        sums = {n: None for n in names}
        count = 0
        for r in range(0, ids.shape[0], chunk):
            session.prefill(ids[r:r + chunk])
            for name, x in zip(names, _Probe.captured):
                x = np.asarray(x, np.float64).reshape(-1, x.shape[-1])  # (tokens, K)
                sq = (x * x).sum(0)
                sums[name] = sq if sums[name] is None else sums[name] + sq
            count += int(np.prod(ids[r:r + chunk].shape))
        del session
    finally:
        if probe_path:
            os.remove(probe_path)
    return {n: s / max(count, 1) for n, s in sums.items()}


def text_importance(onnx_path: str, text, context: int, cache_windows, cache_io: str) -> Dict[str, np.ndarray]:
    """activation_importance over the export's calibration windows of `text` (a TextTokens: its calibration part),
    each at most `context` tokens: what `--weights` with an activation-aware recipe calibrates on."""
    length = min(CALIBRATION_WINDOW, int(context), len(text.train) - 1)
    ids = np.concatenate([x for x, _ in text.windows("train", CALIBRATION_BATCHES, length, batch_size=4)])
    return activation_importance(onnx_path, ids, cache_windows, cache_io)
