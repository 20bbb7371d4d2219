"""The quantize rewrites keep a graph's weights in its data file until the end (export/lazy_weights.py).

upb protobuf frees a field's bytes only with the whole message, so a rewrite that put new weights into a graph holding
its old ones inline held both (Qwen3-1.7B: 18.6 GB after merging, then past 24 GB in the quantizer). Checked here on a
hand-built graph with external data: while merging and untying, no initializer holds its bytes inline and the sources
of a merge never enter the graph; after materialize, every value equals numpy's from the original file; onnxruntime
gives the rewritten graph the original's outputs; a truncated data file is refused in one line.
"""
from __future__ import annotations

import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from paddle_vha.export.errors import ExportError
from paddle_vha.export.lazy_weights import LazyWeights
from paddle_vha.export.merge_matmuls import merge_sibling_matmuls
from paddle_vha.export.quantize import untie_lm_head

K, V = 7, 11  # odd widths: hidden, vocabulary


def _graph(path: str, rng) -> dict:
    """x (B, K) -> q, k, v = x @ Wq, x @ Wk, x @ Wv (siblings); logits = (q + k[:, :1] + v[:, :1]) @ E^T (a tied
    head through a Transpose); ids -> Gather(E). Saved with every weight in model.onnx.data."""
    w = dict(Wq=rng.standard_normal((K, K)), Wk=rng.standard_normal((K, 3)), Wv=rng.standard_normal((K, 5)),
             E=rng.standard_normal((V, K)))
    w = {n: a.astype(np.float32) for n, a in w.items()}
    inits = [numpy_helper.from_array(a, n) for n, a in w.items()]
    inits += [numpy_helper.from_array(np.array([0], np.int64), "s0"), numpy_helper.from_array(np.array([1], np.int64),
                                                                                                "s1"),
              numpy_helper.from_array(np.array([1], np.int64), "ax")]
    nodes = [helper.make_node("MatMul", ["x", "Wq"], ["q"]), helper.make_node("MatMul", ["x", "Wk"], ["k"]),
             helper.make_node("MatMul", ["x", "Wv"], ["v"]),
             helper.make_node("Slice", ["k", "s0", "s1", "ax"], ["k1"]),
             helper.make_node("Slice", ["v", "s0", "s1", "ax"], ["v1"]),
             helper.make_node("Add", ["q", "k1"], ["qk"]), helper.make_node("Add", ["qk", "v1"], ["h"]),
             helper.make_node("Transpose", ["E"], ["Et"], perm=[1, 0]),
             helper.make_node("MatMul", ["h", "Et"], ["logits"]),
             helper.make_node("Gather", ["E", "ids"], ["emb"], axis=0)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", K]),
                                           helper.make_tensor_value_info("ids", TensorProto.INT64, ["B"])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["B", V]),
                               helper.make_tensor_value_info("emb", TensorProto.FLOAT, ["B", K])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save_model(model, path, save_as_external_data=True, all_tensors_to_one_file=True,
                    location="model.onnx.data", size_threshold=0)
    return w


def _run(model, feeds):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def test_rewrites_leave_weights_in_the_file_until_materialize(tmp_path):
    rng = np.random.default_rng(3)
    path = str(tmp_path / "model.onnx")
    w = _graph(path, rng)
    feeds = dict(x=rng.standard_normal((3, K)).astype(np.float32), ids=np.array([0, 10, 4], np.int64))
    want = _run(onnx.load(path), feeds)
    model = onnx.load(path, load_external_data=False)
    store = LazyWeights(model, str(tmp_path))
    assert untie_lm_head(model, store) == "lm_head.weight.untied"
    assert merge_sibling_matmuls(model, store) == 1
    names = {t.name for t in model.graph.initializer}
    assert {"Wq", "Wk", "Wv"}.isdisjoint(names), names  # the merge's sources: gone before they were read
    inline = {t.name: len(t.raw_data) for t in model.graph.initializer if len(t.raw_data) > 64}
    print("inline bytes before materialize:", inline)
    assert not inline, f"weights read into the graph before materialize: {inline}"
    store.materialize()
    got = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    merged = got["merged.0.weight"]
    ref = np.concatenate([w["Wq"], w["Wk"], w["Wv"]], axis=1)  # (K, 7 + 3 + 5)
    print("merged max abs diff", np.abs(merged - ref).max(),
          "head", np.abs(got["lm_head.weight.untied"] - w["E"].T).max())
    assert merged.shape == (K, 15) and np.array_equal(merged, ref)
    assert np.array_equal(got["lm_head.weight.untied"], w["E"].T) and np.array_equal(got["E"], w["E"])
    assert all(t.data_location == TensorProto.DEFAULT for t in model.graph.initializer)
    for a, b in zip(_run(model, feeds), want):
        print("outputs max abs diff", np.abs(a - b).max())
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


def test_truncated_data_file_is_refused_in_one_line(tmp_path):
    path = str(tmp_path / "model.onnx")
    _graph(path, np.random.default_rng(0))
    data = tmp_path / "model.onnx.data"
    data.write_bytes(data.read_bytes()[: os.path.getsize(data) // 2])
    model = onnx.load(path, load_external_data=False)
    store = LazyWeights(model, str(tmp_path))
    with pytest.raises(ExportError, match=r"^\w+: its external data in model.onnx.data is missing or shorter") as e:
        store.materialize()
    assert "\n" not in str(e.value)
