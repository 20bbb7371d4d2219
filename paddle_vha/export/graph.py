"""The graph paddle2onnx writes, cleaned up and checked: outputs named by the KV-cache convention, the Identity copies
and dead nodes dropped, weights as initializers (so they can live in external data and onnxruntime can pre-pack
them), element-wise chains in the forms onnxruntime fuses, dynamic axes named; then onnx.checker's full check (given the path, which it needs past 2 GB), standard ops
only, cache inputs of the serving plan's heads and widths."""
from __future__ import annotations

from .errors import ExportError
from .simplify import simplify_graph

__all__ = ["finalize_graph", "check_graph", "STANDARD_DOMAINS"]

STANDARD_DOMAINS = ("", "ai.onnx")


def _prune(graph) -> None:
    """Drop nodes none of whose outputs is read (repeatedly, so their inputs' producers follow) and initializers no
    node reads: paddle2onnx leaves shape constants behind, and onnxruntime warns about each at session creation."""
    def read_by(nodes):  # names the nodes read, their subgraphs (If / Loop bodies) included
        names = set()
        for n in nodes:
            names.update(n.input)
            for a in n.attribute:
                for g in list(a.graphs) + ([a.g] if a.HasField("g") else []):
                    names |= read_by(g.node) | {o.name for o in g.output}
        return names

    outputs = {o.name for o in graph.output}
    while True:
        read = read_by(graph.node) | outputs
        keep = [n for n in graph.node if any(o in read for o in n.output)]
        if len(keep) == len(graph.node):
            break
        del graph.node[:]
        graph.node.extend(keep)
    read = read_by(graph.node) | outputs
    used = [t for t in graph.initializer if t.name in read]
    del graph.initializer[:]
    graph.initializer.extend(used)


def finalize_graph(model, plan, params=frozenset()):
    """Name outputs as the KV-cache convention says, drop Identity copies, rewrite paddle2onnx's element-wise chains
    into the forms onnxruntime fuses (paddle_vha/export/simplify.py), name the dynamic axes."""
    graph = model.graph
    _, outs = plan.io_names
    if len(graph.output) != len(outs):
        raise ExportError(f"paddle2onnx produced {len(graph.output)} outputs, expected {len(outs)}")
    rename = {}
    for out, name in zip(graph.output, outs):
        rename[out.name] = name
        out.name = name
    nodes = _drop_output_copies(graph, rename)
    nodes, alias = _weights_to_initializers(graph, nodes)
    del graph.node[:]
    graph.node.extend(nodes)
    _resolve_names(graph, alias, rename)
    simplify_graph(model, params)  # params: stand-ins until attach_weights, never constants
    _prune(graph)
    _name_dynamic_axes(graph, plan.cache_io)
    return model


def _drop_output_copies(graph, rename: dict) -> list:
    """The nodes without the Identity nodes that only copy a tensor to a graph output: their producer writes the
    output directly (recorded in `rename`, which readers follow)."""
    keep = []
    for node in graph.node:
        if node.op_type == "Identity" and node.output[0] in rename:
            rename[node.input[0]] = rename[node.output[0]]  # producer now writes the output; readers follow
            continue
        keep.append(node)
    if any(n in rename for n in (i.name for i in graph.input)):
        raise ExportError("an output is a plain copy of an input; refusing to alias graph I/O")
    return keep


def _weights_to_initializers(graph, nodes: list):
    """paddle2onnx writes each weight as a Constant node followed by Identity copies: make the weights initializers
    (so they can live in external data and ORT can pre-pack them) and drop the copies. Returns (the other nodes,
    {copy name: its source})."""
    kept, alias = [], {}
    for node in nodes:
        if node.op_type == "Constant" and len(node.attribute) == 1 and node.attribute[0].name == "value":
            tensor = node.attribute[0].t
            tensor.name = node.output[0]
            graph.initializer.append(tensor)
        elif node.op_type == "Identity":
            alias[node.output[0]] = node.input[0]
        else:
            kept.append(node)
    return kept, alias


def _resolve_names(graph, alias: dict, rename: dict) -> None:
    """Every node's inputs and outputs, and every initializer, named through the dropped copies and the renames."""
    def resolve(name):
        while name in alias:
            name = alias[name]
        return rename.get(name, name)

    for node in graph.node:
        for seq in (node.input, node.output):
            for k, n in enumerate(seq):
                seq[k] = resolve(n)
    for t in graph.initializer:
        t.name = resolve(t.name)


def _name_dynamic_axes(graph, cache_io: str) -> None:
    dims = {"input_ids": ("batch", "sequence"), "attention_mask": ("batch", "total_sequence"),
            "position_ids": ("batch", "sequence")}
    for vi in graph.input:
        names = dims.get(vi.name, ("batch", None, "past_sequence" if cache_io == "concat" else "capacity", None))
        for dim, nm in zip(vi.type.tensor_type.shape.dim, names):
            if nm:
                dim.dim_param = nm
    out_dims = {"logits": ("batch", "sequence", None)}
    for vi in graph.output:
        names = out_dims.get(vi.name, ("batch", None, "total_sequence" if cache_io == "concat" else "sequence", None))
        for dim, nm in zip(vi.type.tensor_type.shape.dim, names):
            if nm:
                dim.dim_param = nm


def check_graph(onnx_path: str, plan) -> list:
    """onnx.checker's full check, standard ops only, I/O named by the convention, cache inputs of the plan's heads
    and widths; returns the graph's op types."""
    import onnx

    onnx.checker.check_model(onnx_path, full_check=True)
    model = onnx.load(onnx_path, load_external_data=False)
    bad = sorted({f"{n.domain}::{n.op_type}" for n in model.graph.node if n.domain not in STANDARD_DOMAINS})
    if bad:
        raise ExportError(f"non-standard ONNX ops in the graph: {', '.join(bad)}")
    ins, outs = plan.io_names
    if [i.name for i in model.graph.input] != ins or [o.name for o in model.graph.output] != outs:
        raise ExportError("graph inputs/outputs are not named by the KV-cache convention")
    for vi, (h, w) in zip(model.graph.input[3:], plan.cache_inputs):
        dims = vi.type.tensor_type.shape.dim
        if (dims[1].dim_value, dims[3].dim_value) != (h, w):
            raise ExportError(f"{vi.name} is [.., {dims[1].dim_value}, .., {dims[3].dim_value}], expected {h} heads "
                              f"of width {w}")
    return sorted({n.op_type for n in model.graph.node})
