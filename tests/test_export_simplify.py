"""paddle_vha/export/simplify.py on a graph in paddle2onnx's form (RMSNorm as Mul x·x, ReduceMean, Mul 1, Add eps,
Sqrt, Reciprocal, Mul, Mul weight; rotate_half's Mul -1 then Add 0): the rewritten graph gives onnxruntime's outputs to
float32 rounding, onnxruntime fuses its norm into SimplifiedLayerNormalization (it fused nothing before), and a
Mul-by-1 whose input has no axis (broadcasting with a [1] constant changes its shape) and an Add-of-0 writing a graph
output are kept."""
import collections

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from paddle_vha.export.simplify import simplify_graph

H = 64


def _paddle2onnx_norm_graph():
    rng = np.random.default_rng(0)
    c = lambda name, v: numpy_helper.from_array(np.asarray(v, np.float32), name)  # noqa: E731
    inits = [c("one", [1.0]), c("eps", 1e-6), c("zero", 0.0), c("minus", [-1.0]), c("w", rng.uniform(0.5, 2, H)),
             c("w2", rng.normal(size=(H, H)) * 0.1), c("s", 3.0)]
    nodes = [
        helper.make_node("Mul", ["x", "x"], ["sq"]),
        helper.make_node("ReduceMean", ["sq"], ["m"], axes=[-1], keepdims=1),
        helper.make_node("Mul", ["m", "one"], ["m1"]),
        helper.make_node("Add", ["m1", "eps"], ["a"]),
        helper.make_node("Sqrt", ["a"], ["r0"]),
        helper.make_node("Reciprocal", ["r0"], ["r"]),
        helper.make_node("Mul", ["x", "r"], ["xn"]),
        helper.make_node("Mul", ["xn", "w"], ["y0"]),
        helper.make_node("MatMul", ["y0", "w2"], ["h"]),
        helper.make_node("Mul", ["h", "minus"], ["hn"]),
        helper.make_node("Add", ["hn", "zero"], ["y"]),
        helper.make_node("Mul", ["s", "one"], ["s1"]),  # 0-d input: Mul by a [1] constant makes it [1]; must stay
    ]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "s", H])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", "s", H]),
                               helper.make_tensor_value_info("s1", TensorProto.FLOAT, [1])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _run(model, x, tmp_path, name):
    opts = ort.SessionOptions()
    opts.optimized_model_filepath = str(tmp_path / f"{name}.opt.onnx")
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    ops = collections.Counter(n.op_type for n in onnx.load(opts.optimized_model_filepath).graph.node)
    return sess.run(None, {"x": x}), ops


def test_rewrites_are_exact_and_let_onnxruntime_fuse_the_norm(tmp_path):
    model = _paddle2onnx_norm_graph()
    x = np.random.default_rng(1).normal(size=(2, 5, H)).astype(np.float32) * 3
    (y_ref, s_ref), ops_ref = _run(model, x, tmp_path, "before")
    counts = simplify_graph(model)
    onnx.checker.check_model(model, full_check=True)
    (y, s), ops = _run(model, x, tmp_path, "after")
    err = float(np.abs(y - y_ref).max() / np.abs(y_ref).max())
    print(f"rewrites {counts}; nodes {len(model.graph.node)}; onnxruntime's graph before {dict(ops_ref)}, after "
          f"{dict(ops)}; max relative output difference {err:.1e}")
    # the Mul by 1 removed; the Add of 0 kept: it writes the graph output y, whose name must stay
    assert counts == dict(identity_scale_removed=1, Neg=1, Pow=1, Div=1), counts
    assert [n.op_type for n in model.graph.node if "y" in n.output] == ["Add"]
    assert err <= 1e-6
    assert s.shape == s_ref.shape == (1,) and s[0] == 3.0  # the 0-d Mul kept: its output shape is [1]
    assert ops_ref["SimplifiedLayerNormalization"] == 0 and ops_ref["Reciprocal"] == 1
    assert ops["SimplifiedLayerNormalization"] == 1 and ops["Reciprocal"] == 0 and ops["Neg"] == 1


def test_a_parameter_is_never_taken_for_a_constant():
    """The export rewrites the graph while every parameter is a one-value stand-in holding its index (0.0, 1.0, ...):
    a parameter named in `params` whose stand-in is 1.0 under a Mul or 0.0 under an Add stays; the same one-value
    initializers not named as parameters are dropped as identities."""
    c = lambda name, v: numpy_helper.from_array(np.asarray(v, np.float32), name)  # noqa: E731

    def graph():
        nodes = [helper.make_node("Mul", ["x", "p1"], ["y0"]), helper.make_node("Add", ["y0", "p0"], ["y1"]),
                 helper.make_node("Mul", ["y1", "y1"], ["y"])]
        g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, H])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, H])],
                              [c("p1", [1.0]), c("p0", [0.0])])
        return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])

    kept, dropped = graph(), graph()
    counts_kept = simplify_graph(kept, params={"p0", "p1"})
    counts_dropped = simplify_graph(dropped)
    ops = lambda m: [n.op_type for n in m.graph.node]  # noqa: E731
    print("params named:", counts_kept, ops(kept), "| not named:", counts_dropped, ops(dropped))
    assert ops(kept) == ["Mul", "Add", "Pow"] and counts_kept["identity_scale_removed"] == 0
    assert ops(dropped) == ["Pow"] and counts_dropped["identity_scale_removed"] == 2
