"""onnxruntime's contrib fused ops for the chains a quantized decoder's step runs most often: rotary embedding and the
residual add before an RMSNorm.

A quantized graph is onnxruntime's own already (MatMulNBits, domain com.microsoft), so its remaining element-wise
chains may use onnxruntime's fused contrib ops too; the float32 export stays standard ONNX. At batch 1 a decode step
is ~1,100 small kernels around the MatMuls, each a kernel call and a thread-pool hand-off (docs/deploy.md has the
profile), so fewer of them is time saved.

Rewrites (each checked against the unfused graph by tests/test_export_fuse_contrib.py):
- rotary embedding: paddle2onnx writes `x * cos + rotate_half(x) * sin` (two Slices, Neg, Concat, two Muls, Add; Qwen3:
  per layer for q and for k, on (B, S, H, d)), always read by one Transpose to (B, H, S, d). When the angles are
  `position_ids * inv_freq` with inv_freq a constant (plain RoPE, or a static scaling folded into inv_freq; not
  dynamic NTK, whose inv_freq depends on the length), the chain and its Transpose become Transpose then
  RotaryEmbedding (com.microsoft; non-interleaved, (B, H, S, d) input, the graph's position_ids) over cos / sin
  tables of `max_positions` rows computed here in float64 from the graph's own float32 angles;
- residual + RMSNorm: Add(a, b) followed by the six nodes of an RMSNorm over it (Pow 2, ReduceMean over the last axis,
  Add eps, Sqrt, Div, Mul weight) becomes SkipSimplifiedLayerNormalization(a, b, weight) whose fourth output is the
  sum, for its other readers (the next residual).
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from .node_edit import GraphIndex, drop_unread_initializers, prune_dead_nodes, splice_nodes

__all__ = ["fuse_contrib_ops"]

MS = "com.microsoft"


def _attr(node, name, default=None):
    from onnx import helper

    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def _angles(g: GraphIndex, cos_name: str, sin_name: str):
    """inv_freq (float32, (half,)) when cos / sin are Cos / Sin of Unsqueeze(Concat(m, m)) with m = Unsqueeze(Cast
    (position_ids)) * inv_freq, inv_freq a constant; else None."""
    c, s = g.op(cos_name, "Cos"), g.op(sin_name, "Sin")
    if c is None or s is None or c.input[0] != s.input[0]:
        return None
    unsq = g.op(c.input[0], "Unsqueeze")
    cat = unsq and g.op(unsq.input[0], "Concat")
    if cat is None or len(cat.input) != 2 or cat.input[0] != cat.input[1]:
        return None
    mul = g.op(cat.input[0], "Mul")
    if mul is None:
        return None
    for pos, freq in (mul.input, mul.input[::-1]):
        inv = g.const(freq)
        u = g.op(pos, "Unsqueeze")
        cast = u and g.op(u.input[0], "Cast")
        if inv is not None and cast is not None and cast.input[0] == "position_ids" and inv.dtype == np.float32:
            return inv.reshape(-1)
    return None


def _slice_half(g: GraphIndex, name: str, x: str, first: bool, half: int) -> bool:
    """name is x[..., :half] (first) or x[..., half:] along the last axis, as a Slice of constant bounds."""
    n = g.op(name, "Slice")
    if n is None or n.input[0] != x or len(n.input) < 4:
        return False
    starts, ends, axes = (g.const(i) for i in n.input[1:4])
    steps = g.const(n.input[4]) if len(n.input) > 4 else np.array([1])
    if any(v is None or v.size != 1 for v in (starts, ends, axes, steps)) or int(steps[0]) != 1:
        return False
    if int(axes[0]) not in (-1, 3):
        return False
    lo, hi = int(starts[0]), int(ends[0])
    return (lo, min(hi, half)) == (0, half) if first else (lo == half and hi >= 2 * half)


def _rope_chains(g: GraphIndex):
    """[(add node, x, cos, sin, inv_freq, transpose node)] of every rotary chain the rewrite takes."""
    found = []
    for add in g.graph.node:
        if add.op_type != "Add" or len(add.input) != 2:
            continue
        muls = [g.op(i, "Mul") for i in add.input]
        if None in muls:
            continue
        for m_cos, m_sin in (muls, muls[::-1]):
            cat = next((g.op(i, "Concat") for i in m_sin.input if g.op(i, "Concat")), None)
            sin = next((i for i in m_sin.input if g.op(i, "Sin")), None)
            cos = next((i for i in m_cos.input if g.op(i, "Cos")), None)
            x = next((i for i in m_cos.input if i != cos), None)
            if cat is None or sin is None or cos is None or x is None or len(cat.input) != 2:
                continue
            if _attr(cat, "axis") not in (-1, 3):
                continue
            neg = g.op(cat.input[0], "Neg")
            inv = _angles(g, cos, sin)
            if neg is None or inv is None:
                continue
            half = inv.size
            if not (_slice_half(g, neg.input[0], x, False, half) and _slice_half(g, cat.input[1], x, True, half)):
                continue
            tr = g.only_reader(add.output[0])
            if tr is None or tr.op_type != "Transpose" or list(_attr(tr, "perm", [])) != [0, 2, 1, 3]:
                continue
            found.append((add, x, cos, sin, inv, tr))
            break
    return found


def _rms_norms(g: GraphIndex):
    """[(residual Add, the norm's last Mul, weight name, epsilon)] for Add -> Pow 2 -> ReduceMean(-1) -> Add eps ->
    Sqrt -> Div -> Mul weight chains."""
    found = []
    for add in g.graph.node:
        if add.op_type != "Add" or len(add.input) != 2 or any(i in g.inits for i in add.input):
            continue
        x = add.output[0]
        pows = [n for n in g.readers.get(x, []) if n.op_type == "Pow"]
        divs = [n for n in g.readers.get(x, []) if n.op_type == "Div" and n.input[0] == x]
        if len(pows) != 1 or len(divs) != 1:
            continue
        two = g.const(pows[0].input[1])
        mean = g.only_reader(pows[0].output[0])
        if two is None or two.size != 1 or float(two.reshape(-1)[0]) != 2.0 or mean is None:
            continue
        axes = _attr(mean, "axes")
        if mean.op_type != "ReduceMean" or list(axes or []) != [-1] or _attr(mean, "keepdims", 1) != 1:
            continue
        eps_add = g.only_reader(mean.output[0])
        if eps_add is None or eps_add.op_type != "Add":
            continue
        eps = next((g.const(i) for i in eps_add.input if i != mean.output[0]), None)
        if eps is None or eps.size != 1:
            continue
        sqrt = g.only_reader(eps_add.output[0])
        if sqrt is None or sqrt.op_type != "Sqrt" or divs[0].input[1] != sqrt.output[0]:
            continue
        if g.only_reader(sqrt.output[0]) is not divs[0]:
            continue
        mul = g.only_reader(divs[0].output[0])
        if mul is None or mul.op_type != "Mul":
            continue
        weight = next((i for i in mul.input if i != divs[0].output[0] and i in g.inits), None)
        if weight is None or len(g.inits[weight].dims) != 1:
            continue
        found.append((add, mul, weight, float(eps.reshape(-1)[0])))
    return found


def fuse_contrib_ops(model, max_positions: Optional[int] = None, weights=None) -> dict:
    """Apply the rewrites to `model` in place; returns how many of each were made. max_positions: the rows of the
    rotary tables (the positions a session may reach: the model's max_position_embeddings); None: no rotary fusion.
    `weights`: the graph's LazyWeights when its constants may be external data (export/lazy_weights.py)."""
    from onnx import TensorProto, helper, numpy_helper

    graph = model.graph
    g = GraphIndex(graph, read=weights.array if weights is not None else None)
    replace, dead, inits = {}, set(), []
    tables = {}
    ropes = _rope_chains(g) if max_positions else []
    for k, (add, x, cos, sin, inv, tr) in enumerate(ropes):
        key = inv.tobytes()
        if key not in tables:
            # the graph's float32 angles (float32(position) * inv_freq, rounded to float32), their cos / sin in float64
            pos = np.arange(max_positions, dtype=np.float32)[:, None]
            ang = (pos * inv[None, :]).astype(np.float64)  # (max_positions, half)
            name = f"fused.rope.{len(tables)}"
            inits += [numpy_helper.from_array(np.cos(ang).astype(np.float32), name + ".cos"),
                      numpy_helper.from_array(np.sin(ang).astype(np.float32), name + ".sin")]
            tables[key] = name
        name = tables[key]
        t_in = f"fused.rope_in.{k}"
        nodes = [helper.make_node("Transpose", [x], [t_in], perm=[0, 2, 1, 3], name=f"fused.rope_transpose.{k}"),
                 helper.make_node("RotaryEmbedding", [t_in, "position_ids", name + ".cos", name + ".sin"],
                                  [tr.output[0]], domain=MS, interleaved=0, name=f"fused.rope.{k}")]
        replace[id(tr)] = nodes  # where the Transpose was: x and position_ids exist there
        dead.add(id(add))
    norms = _rms_norms(g)
    for k, (add, mul, weight, eps) in enumerate(norms):
        summed = add.output[0]
        node = helper.make_node("SkipSimplifiedLayerNormalization", [add.input[0], add.input[1], weight],
                                [mul.output[0], "", "", summed], domain=MS, epsilon=eps, name=f"fused.skip_norm.{k}")
        replace[id(add)] = [node]
        dead.add(id(mul))  # its output is the fused node's now; Pow .. Div lose their readers and are pruned
    if not ropes and not norms:
        return dict(rotary_embedding=0, skip_simplified_layer_norm=0)
    splice_nodes(graph, replace, dead)
    graph.initializer.extend(inits)
    prune_dead_nodes(graph)  # the replaced chains' remains (Pow .. Div, rotate_half, the shared cos / sin)
    drop_unread_initializers(graph)  # their constants (the inv_freq, the slice bounds)
    if not any(o.domain == MS for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(MS, 1))
    return dict(rotary_embedding=len(ropes), skip_simplified_layer_norm=len(norms))
