"""`--kv-cache int8`: the exported decoder's KV cache stored in 8 bits, a quarter of the float32 cache's bytes.

The float32 graph is exported and validated first (and quantized, for --weights int8 / int4); `quantize_cache` then
rewrites its attention in place: every layer's past / new (or present) key and value tensors become four,

    past_key_values.{i}.key          uint8 (batch, H_kv, positions, head_dim)   round(k / scale) + 128
    past_key_values.{i}.key_scale    float (batch, H_kv, positions, 1)
    past_key_values.{i}.value        int8  (batch, H_kv, positions, head_dim)   round(v / scale)
    past_key_values.{i}.value_scale  float (batch, H_kv, positions, 1)

(outputs `new.{i}.*` for the buffer flavour, `present.{i}.*` for concat), each token's key and value quantized per KV
head (symmetric, scale = the largest |x| / 127) once, when the step that makes it writes it; attention reads them
with onnxruntime's MatMulIntegerToFloat (paddle_vha/export/int8_attention.py: the nodes and why they are these).
A cached position costs 2 x (head_dim + 4) bytes per KV head: 264 at head_dim 128, against float32's 1,024.
Only the new positions are written per step, so the buffer flavour keeps its in-place cache (paddle_vha/serve/).

What the rewrite takes: layers that cache a key and a value tensor (stock GQA, the folded VHA), full attention (no
sliding window); the new entries come out of the float32 graph as they did, so the current step's own tokens are
attended in float32 (in the buffer flavour; the concat flavour attends to its present, quantized). Refused in one line
otherwise (kv_cache_refusal), and so are 16-bit caches (FLOAT16_REFUSAL). The graph then holds MatMulIntegerToFloat
(contrib domain com.microsoft): onnxruntime and paddle_vha.serve run it; onnxruntime-genai and Paddle Inference do not
(genai_config.json is not written; paddle_vha/serve/paddle_inference.py refuses the folder).
"""
from __future__ import annotations

import os
from typing import Optional

from .errors import ExportError
from .int8_attention import MS, PROBABILITY_DIGITS, QUERY_DIGITS, Nodes, encode, int8_scores, int8_values
from .node_edit import GraphIndex, drop_unread_initializers, prune_dead_nodes, splice_nodes

__all__ = ["KV_CACHE_FORMATS", "FLOAT16_REFUSAL", "INT8_NAMES", "check_kv_cache", "kv_cache_refusal",
           "quantize_cache", "GENAI_REFUSAL", "INT8_LAYOUT", "cache_bytes_per_position"]

KV_CACHE_FORMATS = ("fp32", "int8")
FLOAT16_REFUSAL = ("onnxruntime 1.32's CPU execution provider has no float16 or bfloat16 MatMul (its MatMul kernels "
                   "take float and double), so a 16-bit cache would be cast to float32 whole at every step and read "
                   "twice; its GroupQueryAttention takes a 16-bit cache only with 16-bit activations. Use --kv-cache "
                   "int8 for a smaller cache")
GENAI_REFUSAL = ("the int8 cache (four tensors a layer: 8-bit keys and values, per-token scales, read by "
                 "MatMulIntegerToFloat) is this project's own interface; onnxruntime-genai 0.18's quantized cache is "
                 "its GroupQueryAttention's, with static per-channel scales")
INT8_NAMES = ("key", "key_scale", "value", "value_scale")  # a layer's cache tensors, in the graph's order
# per tensor: element type and its dims ("positions" the axis the cache grows along), as export_info.json records it
INT8_LAYOUT = {"key": ("uint8", ["batch", "kv_heads", "positions", "head_dim"]),
               "key_scale": ("float32", ["batch", "kv_heads", "positions", 1]),
               "value": ("int8", ["batch", "kv_heads", "positions", "head_dim"]),
               "value_scale": ("float32", ["batch", "kv_heads", "positions", 1])}


def check_kv_cache(kv_cache: str) -> None:
    """ExportError (one line) for a cache format the export does not write."""
    if kv_cache in ("fp16", "bf16"):
        raise ExportError(f"--kv-cache {kv_cache}: refused: {FLOAT16_REFUSAL}")
    if kv_cache not in KV_CACHE_FORMATS:
        raise ExportError(f"--kv-cache {kv_cache!r}: expected one of {', '.join(KV_CACHE_FORMATS)}")


def kv_cache_refusal(plan) -> Optional[str]:
    """Why the int8 cache cannot be written for this serving plan's layers, or None."""
    odd = [i for i, names in enumerate(plan.cache_names) if tuple(names) != ("key", "value")]
    if odd:
        return (f"layer {odd[0]} caches {len(plan.cache_names[odd[0]])} tensor(s) {tuple(plan.cache_names[odd[0]])}, "
                "not a key and a value: --kv-cache int8 is offered for stock GQA layers")
    if any(plan.cache_windows):
        return "--kv-cache int8 is not offered for sliding-window layers (their cache keeps only the window)"
    return None


def cache_bytes_per_position(kv_cache: str, cache_shapes) -> int:
    """Bytes one cached position takes over all layers and one sequence: per layer (heads, width) of its key and
    value tensors; int8 adds a float32 scale per head to each."""
    if kv_cache == "int8":
        return sum(2 * int(h) * (int(w) + 4) for h, w in cache_shapes)
    return sum(2 * 4 * int(h) * int(w) for h, w in cache_shapes)


def _value_info(name, elem, dims):
    from onnx import helper

    return helper.make_tensor_value_info(name, elem, dims)


def _dims(layout, heads: int, width: int, positions: str):
    return ["batch" if d == "batch" else heads if d == "kv_heads" else width if d == "head_dim" else
            positions if d == "positions" else d for d in layout]


class _Layer:
    """One layer's rewrite: its new entries encoded, its cache tensors as attention reads them, its reads replaced."""

    def __init__(self, g: GraphIndex, i: int, cache_io: str, heads: int, width: int, fused: bool = False):
        self.g, self.i, self.cache_io, self.heads, self.width = g, i, cache_io, heads, width
        self.fused = fused  # the whole attention as one DecodeAttentionInt8 node (paddle_vha/export/fused_attention.py)
        self.nb = Nodes(f"kv_cache.{i}")
        self.past = {n: f"past_key_values.{i}.{n}" for n in INT8_NAMES}
        out = "present" if cache_io == "concat" else "new"
        self.out = {n: f"{out}.{i}.{n}" for n in INT8_NAMES}
        self.replace, self.drop, self.tail = {}, set(), []  # node id -> new nodes; node ids to drop; nodes to append

    def fail(self, what: str):
        raise ExportError(f"--kv-cache int8: layer {self.i}: {what}; the graph is not the float32 export's layout "
                          "the rewrite knows")

    def new_entries(self, name: str):
        """(the float32 new entries (B, H, S, d) of `name`, the tensor attention reads as the whole cache of it, the
        Concat node that made the float present (concat flavour) or None)."""
        g, out = self.g, self.out[name]
        if self.cache_io == "buffer":
            maker = g.made.get(out)
            if maker is None:
                self.fail(f"no node makes {out}")
            fresh = f"kv_cache.{self.i}.{name}.float"
            for k, o in enumerate(maker.output):
                if o == out:
                    maker.output[k] = fresh
            for r in g.readers.get(out, []):
                for k, x in enumerate(r.input):
                    if x == out:
                        r.input[k] = fresh
            return fresh, self.past[name], None
        cat = g.made.get(out)
        if cat is None or cat.op_type != "Concat" or list(cat.input)[:1] != [self.past[name]] or len(cat.input) != 2:
            self.fail(f"{out} is not Concat(past, new)")
        self.drop.add(id(cat))
        return cat.input[1], out, cat

    def _write(self, name: str, new: str, cat) -> dict:
        """The new entries of `name` ("key" / "value") encoded, and the cache tensors attention reads: the buffers
        (buffer flavour: the outputs are the new entries), or present = past + new along each tensor's positions axis
        (concat: made where the float Concat was, before its readers)."""
        nb = self.nb
        q, scale = encode(nb, new, keys=name == "key")  # (B, H, S, d) uint8 keys / int8 values; (B, H, S, 1)
        cache = {}
        for part, x in ((name, q), (f"{name}_scale", scale)):
            if self.cache_io == "buffer":
                nb.op("Identity", [x], out=self.out[part])
                cache[part] = self.past[part]
            else:  # along the positions, axis 2
                cache[part] = nb.op("Concat", [self.past[part], x], axis=2, out=self.out[part])
        if cat is None:
            self.tail += nb.nodes  # after everything: it reads only the new entries and makes outputs
        else:
            self.replace[id(cat)] = list(nb.nodes)
        nb.nodes.clear()
        return cache

    def rewrite(self):
        nb, g = self.nb, self.g
        (k_new, k_read, k_cat), (v_new, v_read, v_cat) = self.new_entries("key"), self.new_entries("value")
        cache = {**self._write("key", k_new, k_cat), **self._write("value", v_new, v_cat)}
        if self.fused:
            from .fused_attention import chain

            c = chain(g, self.cache_io, k_read, v_read, self.fail)
            self.replace[id(c.nodes[-1])] = [c.node([cache[n] for n in INT8_NAMES], True, f"fused_attention.{self.i}")]
            self.drop |= {id(n) for n in c.nodes[:-1]}
            return self
        for r in g.readers.get(k_read, []):
            if r.op_type == "Transpose" and list(_attr(r, "perm") or []) == [0, 1, 3, 2]:
                for m in g.readers.get(r.output[0], []):
                    if m.op_type != "MatMul" or m.input[1] != r.output[0]:
                        self.fail(f"the keys' transpose is read by a {m.op_type}")
                    int8_scores(nb, m.input[0], cache["key"], cache["key_scale"], m.output[0])
                    self.replace[id(m)] = list(nb.nodes)
                    nb.nodes.clear()
                self.drop.add(id(r))
            elif r.op_type == "Shape" and self.cache_io == "buffer":  # the capacity: axis 2, as it was
                pass
            elif id(r) not in self.drop:
                self.fail(f"the keys are read by a {r.op_type}")
        for r in g.readers.get(v_read, []):
            if r.op_type == "MatMul" and r.input[1] == v_read:
                int8_values(nb, r.input[0], cache["value"], cache["value_scale"], r.output[0])
                self.replace[id(r)] = list(nb.nodes)
                nb.nodes.clear()
            elif id(r) not in self.drop:
                self.fail(f"the values are read by a {r.op_type}")
        return self


def _attr(node, name):
    from onnx import helper

    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return None


def quantize_cache(onnx_path: str, plan, attention_op: str = "stock") -> dict:
    """Rewrite the decoder at `onnx_path` (float32 cache, the layout of `plan`, a ServingPlan) to the int8 cache, in
    place; its weights (inline or in model.onnx.data) are not touched. Returns export_info.json's "kv_cache" entry."""
    import onnx
    from onnx import TensorProto, helper

    why = kv_cache_refusal(plan)
    if why:
        raise ExportError(why)
    model = onnx.load(onnx_path, load_external_data=False)
    graph = model.graph
    g = GraphIndex(graph)
    fused = attention_op == "fused"
    layers = [_Layer(g, i, plan.cache_io, h, w, fused).rewrite() for i, (h, w) in enumerate(plan.cache_shapes)]
    replace, drop = {}, set()
    for layer in layers:
        replace.update(layer.replace)
        drop |= layer.drop
    splice_nodes(graph, replace, drop)
    for layer in layers:
        graph.node.extend(layer.tail)
        graph.initializer.extend(layer.nb.inits)
    past_dim, out_dim = ("past_sequence", "total_sequence") if plan.cache_io == "concat" else ("capacity", "sequence")
    elem = {"int8": TensorProto.INT8, "uint8": TensorProto.UINT8, "float32": TensorProto.FLOAT}
    inputs = list(graph.input[:3])
    outputs = [graph.output[0]]
    for layer in layers:
        for name in INT8_NAMES:
            dtype, layout = INT8_LAYOUT[name]
            inputs.append(_value_info(layer.past[name], elem[dtype], _dims(layout, layer.heads, layer.width, past_dim)))
            outputs.append(_value_info(layer.out[name], elem[dtype], _dims(layout, layer.heads, layer.width, out_dim)))
    del graph.input[:]
    graph.input.extend(inputs)
    del graph.output[:]
    graph.output.extend(outputs)
    prune_dead_nodes(graph)  # the float attention's transposes of the cache, the float present's Concat
    drop_unread_initializers(graph)
    if not any(o.domain == MS for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(MS, 1))
    if fused:
        from .fused_attention import add_domain

        add_domain(model)
    with open(onnx_path + ".tmp", "wb") as f:  # beside the data file its external references name
        f.write(model.SerializeToString())
    try:
        onnx.checker.check_model(onnx_path + ".tmp")  # by path: it finds model.onnx.data there, at any size
    except onnx.checker.ValidationError as e:
        os.remove(onnx_path + ".tmp")
        raise ExportError(f"--kv-cache int8: the rewritten graph fails onnx.checker: {str(e).splitlines()[0][:300]}")
    os.replace(onnx_path + ".tmp", onnx_path)
    per_position = cache_bytes_per_position("int8", plan.cache_shapes)
    return dict(format="int8", names=list(INT8_NAMES),
                layout={n: dict(dtype=t, dims=d) for n, (t, d) in INT8_LAYOUT.items()},
                scales="per token and KV head, symmetric: the largest |x| / 127, float32; keys uint8 with zero point "
                       "128",
                attention=("DecodeAttentionInt8 (ai.paddle_vha, paddle-vha's onnxruntime op library): the cache "
                           "dequantized on the fly, float32 arithmetic" if fused else
                           f"MatMulIntegerToFloat (com.microsoft): keys . queries^T with the queries in {QUERY_DIGITS} "
                           f"8-bit digits per row; probabilities x value scales . values in {PROBABILITY_DIGITS}"),
                bytes_per_position=per_position,
                float32_bytes_per_position=cache_bytes_per_position("fp32", plan.cache_shapes))
