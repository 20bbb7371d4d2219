"""Sibling MatMuls (one activation, several constant weights) merged into one MatMul and a Split, before quantization.

A Qwen3 layer multiplies one normed hidden state by q_proj, k_proj and v_proj, and another by gate_proj and up_proj:
five weight MatMuls where two suffice. Merged, each group is one MatMul over the weights concatenated along the output
axis, (K, N_1 + N_2 + ...), followed by a Split back into the original outputs. Exact: every output column is the same
dot product as before, and MatMulNBits quantizes each output column's blocks along K on their own, so the quantized
merged weight holds the very blocks and scales the separate ones would. What it saves a decode step (batch 1) is
kernel calls and, at accuracy_level 4, the int8 quantization of the shared activation, done once per group instead
of once per weight (docs/deploy.md has the measurement).
"""
from __future__ import annotations

import numpy as np

from .node_edit import splice_nodes

__all__ = ["merge_sibling_matmuls"]


def _float_matrices(graph) -> dict:
    """{initializer name: tensor} for inline float32 2-D initializers (the weights a MatMul may read)."""
    from onnx import TensorProto

    return {t.name: t for t in graph.initializer
            if t.data_type == TensorProto.FLOAT and len(t.dims) == 2 and t.raw_data}


def merge_sibling_matmuls(model) -> int:
    """Merge, in place, every group of >= 2 MatMuls that read the same activation and each a float32 2-D constant of
    the same input width; returns the number of groups merged. A weight read by anything else stays as it is."""
    from onnx import TensorProto, helper

    graph = model.graph
    mats = _float_matrices(graph)
    readers = {}
    for n in graph.node:
        for name in n.input:
            readers[name] = readers.get(name, 0) + 1
    groups = {}
    for n in graph.node:
        if n.op_type == "MatMul" and len(n.input) == 2 and n.input[1] in mats and readers[n.input[1]] == 1:
            k = mats[n.input[1]].dims[0]
            groups.setdefault((n.input[0], k), []).append(n)
    merged, replace, drop, gone = 0, {}, set(), set()
    for (activation, k), nodes in groups.items():
        if len(nodes) < 2:
            continue
        widths = [int(mats[n.input[1]].dims[1]) for n in nodes]
        # (K, N_1 + N_2 + ...): each weight's columns, in the nodes' order
        weight = np.concatenate([np.frombuffer(mats[n.input[1]].raw_data, np.float32).reshape(k, w)
                                 for n, w in zip(nodes, widths)], axis=1)
        base = f"merged.{merged}"
        tensor = TensorProto(name=base + ".weight", data_type=TensorProto.FLOAT, dims=list(weight.shape))
        tensor.raw_data = weight.tobytes()
        del weight
        graph.initializer.append(tensor)
        sizes = helper.make_tensor(base + ".split", TensorProto.INT64, [len(widths)], widths)
        graph.initializer.append(sizes)
        matmul = helper.make_node("MatMul", [activation, tensor.name], [base + ".out"], name=base + ".matmul")
        split = helper.make_node("Split", [base + ".out", sizes.name], [n.output[0] for n in nodes], axis=-1,
                                 name=base + ".split")
        replace[id(nodes[0])] = [matmul, split]  # at the first sibling: its activation exists there, readers follow
        drop.update(id(n) for n in nodes[1:])
        for n in nodes:  # the separate weights: emptied now (the peak stays the weights plus one group), dropped below
            mats.pop(n.input[1]).ClearField("raw_data")
            gone.add(n.input[1])
        merged += 1
    if not merged:
        return 0
    splice_nodes(graph, replace, drop)
    keep = [t for t in graph.initializer if t.name not in gone]
    del graph.initializer[:]
    graph.initializer.extend(keep)
    return merged
