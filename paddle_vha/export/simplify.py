"""Exact rewrites of paddle2onnx's element-wise chains into the forms onnxruntime's own graph optimizer fuses.

paddle2onnx writes Paddle's `scale` as Mul(x, s) then Add(·, b) even when s = 1 / b = 0, `x ** 2` as Mul(x, x) and
`rsqrt` as Sqrt then Reciprocal. So Qwen3's RMSNorm, 8 nodes (Mul x·x, ReduceMean, Mul 1, Add eps, Sqrt, Reciprocal,
Mul, Mul weight), is missed by onnxruntime's SimplifiedLayerNormFusion (which looks for Pow(x, 2), ReduceMean, Add eps,
Sqrt, Div, Mul weight) and rotate_half's negation is two nodes (Mul -1, Add 0). At the Qwen3-0.6B shape that is
~2,300 nodes a decode step runs one by one; each costs a kernel launch and a thread-pool hand-off.

Rewrites (standard ONNX, the graph stays opset-portable; every one exact in IEEE float32 but Div for Mul-by-reciprocal,
which rounds once instead of twice):
- Mul(x, c) with c a one-value constant equal to 1, and Add(x, c) with c equal to 0: removed (x read instead), where x
  has at least one axis (so broadcasting with c cannot change the shape);
- Mul(x, -1) (one-value constant): Neg(x);
- Mul(x, x): Pow(x, 2);
- Mul(x, Reciprocal(Sqrt(a))) where the Reciprocal feeds nothing else: Div(x, Sqrt(a)).
onnxruntime then fuses each RMSNorm into one SimplifiedLayerNormalization (and the residual Add before it into
SkipSimplifiedLayerNormalization) when it loads the graph.
"""
from __future__ import annotations

import numpy as np

from .node_edit import GraphIndex, splice_nodes

__all__ = ["simplify_graph"]


def _scalar_constants(graph, params) -> dict:
    """{initializer name: its float value} for float32 initializers holding exactly one value that are no model
    parameter: the rewrite runs while every parameter is still a one-value stand-in (its index: weights.py), so a
    parameter whose stand-in is 0.0 or 1.0 would read as an identity constant."""
    from onnx import TensorProto, numpy_helper

    out = {}
    for t in graph.initializer:
        if t.name in params:
            continue
        if t.data_type == TensorProto.FLOAT and int(np.prod(t.dims)) == 1 and len(t.dims) <= 1:
            out[t.name] = float(numpy_helper.to_array(t).reshape(-1)[0])
    return out


def _ranks(graph, opset_imports) -> dict:
    """{value name: rank} from ONNX shape inference over a weightless copy of the graph (initializers become typed
    inputs, so a graph holding gigabytes of weights is inferred without copying them)."""
    from onnx import helper, shape_inference

    inits = [helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in graph.initializer]
    skeleton = helper.make_graph(list(graph.node), "ranks", list(graph.input) + inits, list(graph.output))
    model = helper.make_model(skeleton, opset_imports=list(opset_imports))
    inferred = shape_inference.infer_shapes(model).graph
    ranks = {}
    for v in list(inferred.value_info) + list(inferred.input) + list(inferred.output):
        if v.type.tensor_type.HasField("shape"):
            ranks[v.name] = len(v.type.tensor_type.shape.dim)
    return ranks


def _identity_operand(node, consts: dict, ranks: dict):
    """(the other input) when node is Mul by 1 or Add of 0 (either operand order) and that input has at least one
    axis (so broadcasting with the one-value constant leaves its shape), else None."""
    want = {"Mul": 1.0, "Add": 0.0}.get(node.op_type)
    if want is None or len(node.input) != 2:
        return None
    a, b = node.input
    for x, c in ((a, b), (b, a)):
        if consts.get(c) == want and x not in consts and ranks.get(x, 0) >= 1:
            return x
    return None


def _drop_identities(graph, consts: dict, ranks: dict, keep: set) -> int:
    """Remove Mul-by-1 / Add-of-0 nodes whose output is no graph output; their readers read the input instead."""
    alias, nodes = {}, []
    for n in graph.node:
        for i, name in enumerate(n.input):
            while name in alias:
                name = alias[name]
            n.input[i] = name
        src = _identity_operand(n, consts, ranks)
        if src is not None and n.output[0] not in keep:
            alias[n.output[0]] = src
            continue
        nodes.append(n)
    del graph.node[:]
    graph.node.extend(nodes)
    return len(alias)


def _constant(graph, name: str, value: float) -> str:
    from onnx import helper, TensorProto

    if name not in {t.name for t in graph.initializer}:
        graph.initializer.append(helper.make_tensor(name, TensorProto.FLOAT, [], [value]))
    return name


def _rewrite_nodes(graph, consts: dict) -> dict:
    """Neg for Mul by -1, Pow for Mul(x, x), Div for Mul by Reciprocal(Sqrt(·)); counts of each."""
    g = GraphIndex(graph)  # built before the loop: the rewrites below change node types, not what makes a value
    made, outputs = g.made, g.outputs
    counts = dict(Neg=0, Pow=0, Div=0)
    dead = set()
    for n in graph.node:
        if n.op_type != "Mul" or len(n.input) != 2:
            continue
        a, b = n.input
        if consts.get(b) == -1.0 or consts.get(a) == -1.0:
            x = a if consts.get(b) == -1.0 else b
            n.op_type, n.input[:] = "Neg", [x]
            counts["Neg"] += 1
        elif a == b:
            n.op_type, n.input[1] = "Pow", _constant(graph, "simplify.two", 2.0)
            counts["Pow"] += 1
        else:
            for x, r in ((a, b), (b, a)):
                rec = made.get(r)
                if (rec is not None and rec.op_type == "Reciprocal" and g.n_readers(r) == 1 and r not in outputs
                        and rec.input[0] in made and made[rec.input[0]].op_type == "Sqrt"):
                    n.op_type, n.input[:] = "Div", [x, rec.input[0]]
                    dead.add(id(rec))
                    counts["Div"] += 1
                    break
    splice_nodes(graph, {}, dead)
    return counts


def simplify_graph(model, params=frozenset()) -> dict:
    """Apply the module's rewrites to `model`'s graph in place; returns how many nodes each rewrite touched.
    `params`: the names of the initializers that are model parameters (never taken for constants)."""
    graph = model.graph
    consts = _scalar_constants(graph, set(params))
    keep = {o.name for o in graph.output}
    dropped = _drop_identities(graph, consts, _ranks(graph, model.opset_import), keep)
    counts = _rewrite_nodes(graph, consts)
    return dict(identity_scale_removed=dropped, **counts)
