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

from typing import Callable, Dict, List, Optional

import numpy as np

from .lazy_weights import LazyWeights
from .node_edit import GraphIndex, drop_unread_initializers, splice_nodes

__all__ = ["merge_sibling_matmuls"]


def merge_sibling_matmuls(model, weights: Optional[LazyWeights] = None, key: Optional[Callable[[str], object]] = None,
                          members: Optional[Dict[str, List[str]]] = None) -> int:
    """Merge, in place, every group of >= 2 MatMuls that read the same activation and each a float32 2-D constant of
    the same input width (and the same `key(weight name)`, when given: a mixed-precision export merges only weights
    of the same bits); returns the number of groups merged. A weight read by anything else stays as it is.
    `weights`: the graph's LazyWeights when its weights are still external (the merged ones are then recipes, read at
    its materialize); without it the graph is inline and the merged weights are computed here. `members`, when
    given, gets {merged weight name: [the weights it holds, in order]}."""
    from onnx import TensorProto, helper

    graph = model.graph
    store = weights if weights is not None else LazyWeights(model)
    mats = {t.name: t for t in graph.initializer if store.is_matrix(t, TensorProto.FLOAT)}
    g = GraphIndex(graph)
    groups = {}
    for n in graph.node:
        if n.op_type == "MatMul" and len(n.input) == 2 and n.input[1] in mats and g.n_readers(n.input[1]) == 1:
            k = mats[n.input[1]].dims[0]
            groups.setdefault((n.input[0], k, key(n.input[1]) if key else None), []).append(n)
    merged, replace, drop = 0, {}, set()
    for (activation, k, _), nodes in groups.items():
        if len(nodes) < 2:
            continue
        widths = [int(mats[n.input[1]].dims[1]) for n in nodes]
        sources = [store.array(mats[n.input[1]]) for n in nodes]  # each (K, N_i): maps of the data file, or copies
        base = f"merged.{merged}"
        # (K, N_1 + N_2 + ...): each weight's columns, in the nodes' order
        tensor = store.add(base + ".weight", TensorProto.FLOAT, [k, sum(widths)],
                           lambda sources=sources: np.concatenate(sources, axis=1))
        sizes = helper.make_tensor(base + ".split", TensorProto.INT64, [len(widths)], widths)
        graph.initializer.append(sizes)
        matmul = helper.make_node("MatMul", [activation, tensor.name], [base + ".out"], name=base + ".matmul")
        split = helper.make_node("Split", [base + ".out", sizes.name], [n.output[0] for n in nodes], axis=-1,
                                 name=base + ".split")
        if members is not None:
            members[tensor.name] = [n.input[1] for n in nodes]
        replace[id(nodes[0])] = [matmul, split]  # at the first sibling: its activation exists there, readers follow
        drop.update(id(n) for n in nodes[1:])
        merged += 1
    if not merged:
        return 0
    splice_nodes(graph, replace, drop)
    drop_unread_initializers(graph)  # the separate weights
    if weights is None:
        store.materialize()
    return merged
