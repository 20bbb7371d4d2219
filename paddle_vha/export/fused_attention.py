"""`export_onnx --attention-op fused`: each layer's attention over the cache as one node of paddle-vha's onnxruntime
custom-op library (ops/ort, domain ai.paddle_vha; docs/deploy.md "The fused attention op").

The float32 export's attention, per layer, is the chain

    scores = MatMul(q, Transpose(K, perm 0 1 3 2));  Mul(scores, scale);  Add(., mask);  Softmax(axis -1);
    y = MatMul(p, V)

with q the grouped queries (B, H_kv, R, d), K / V the whole cache the step attends ((B, H_kv, T, d): present in the
concat flavour) and mask (B, 1, R, T) additive. `attention_chain` finds it from the tensor the keys are read as;
`fuse_float` replaces it by DecodeAttention(q, K, V, mask, scale) writing y (the same value name, so every reader of
y is untouched), and paddle_vha/export/kv_cache.py replaces it by DecodeAttentionInt8 over the int8 cache. The
graph needs the library registered: a copy of it ships in the export folder (LIBRARY_FILE), paddle_vha.serve
registers it (paddle_vha/serve/ort_ops), onnxruntime-genai loads it from genai_config.json's
session_options.custom_ops_library (resolved against the folder; tested with genai 0.18), stock onnxruntime with
SessionOptions.register_custom_ops_library(OUT_DIR/LIBRARY_FILE); without it onnxruntime refuses the graph naming the
op. Paddle Inference runs paddle/ (the static program, the stock attention).

In the buffer flavour the chain attends the buffer and the step's new entries apart (two score blocks joined before
the softmax, the probabilities split after it; `buffer_chain`): it becomes DecodeAttentionBuffer[Int8] with the new
entries as two more inputs, attended after the buffer in float32.
"""
from __future__ import annotations

from typing import Optional

from .errors import ExportError
from .node_edit import GraphIndex, drop_unread_initializers, prune_dead_nodes, splice_nodes

__all__ = ["ATTENTION_OPS", "DOMAIN", "LIBRARY_FILE", "ship_library", "Chain", "attention_chain", "fuse_float", "check_attention_op",
           "attention_op_refusal"]

ATTENTION_OPS = ("stock", "fused")
DOMAIN = "ai.paddle_vha"
from ..serve.ort_ops import LIBRARY_FILE  # noqa: E402 - the library's copy in the export folder (genai names it)


class Chain:
    """One layer's attention nodes: q (the grouped queries), mask, scale, y (the output's name), nodes (to drop); in
    the buffer flavour also the step's new entries (k_new, v_new), attended after the buffer."""

    def __init__(self, q, mask, scale, y, nodes, k_new=None, v_new=None):
        self.q, self.mask, self.scale, self.y, self.nodes = q, mask, scale, y, nodes
        self.k_new, self.v_new = k_new, v_new

    def node(self, cache_inputs, int8: bool, name: str):
        """The fused node replacing the chain; cache_inputs: (key, value) or the int8 layout's four tensors."""
        from onnx import helper

        op = "DecodeAttention" + ("Buffer" if self.k_new else "") + ("Int8" if int8 else "")
        inputs = [self.q, *cache_inputs, self.mask] + ([self.k_new, self.v_new] if self.k_new else [])
        return helper.make_node(op, inputs, [self.y], name=name, domain=DOMAIN, scale=self.scale)


def check_attention_op(op: str) -> None:
    if op not in ATTENTION_OPS:
        raise ExportError(f"--attention-op {op!r}: expected one of {', '.join(ATTENTION_OPS)}")


def attention_op_refusal(cache_io: str) -> Optional[str]:
    if cache_io not in ("concat", "buffer"):
        return f"--attention-op fused: --cache {cache_io!r} is not a flavour the rewrite knows"
    return None


def _scalar(g: GraphIndex, name: str) -> Optional[float]:
    v = g.const(name)
    if v is None:
        c = g.op(name, "Constant")
        if c is not None:
            from onnx import helper, numpy_helper

            v = numpy_helper.to_array(helper.get_attribute_value(c.attribute[0]))
    return float(v.reshape(-1)[0]) if v is not None and v.size == 1 else None


def _keys_product(g: GraphIndex, keys: str, fail, what: str):
    """(Transpose, MatMul) of q . keys^T: the one Transpose reading `keys` and the one MatMul reading it on the right."""
    kt = [r for r in g.readers.get(keys, []) if r.op_type == "Transpose"]
    if len(kt) != 1:
        fail(f"{keys} is not read by one Transpose")
    mm = g.only_reader(kt[0].output[0])
    if mm is None or mm.op_type != "MatMul" or mm.input[1] != kt[0].output[0]:
        fail(f"{what} Transpose is not read by one MatMul as its right operand")
    return kt[0], mm


def _masked_softmax(g: GraphIndex, scores: str, fail, what: str):
    """(Add, mask, Softmax): the one Add masking `scores` and the one Softmax reading it."""
    add = g.only_reader(scores)
    if add is None or add.op_type != "Add":
        fail(f"the {what} scores are not masked by one Add")
    mask = add.input[1] if add.input[0] == scores else add.input[0]
    sm = g.only_reader(add.output[0])
    if sm is None or sm.op_type != "Softmax":
        fail("the masked scores are not read by one Softmax")
    return add, mask, sm


def attention_chain(g: GraphIndex, keys: str, values: str, fail) -> Chain:
    """The chain reading `keys` / `values` (the module docstring); fail(what) raises when the graph differs."""
    kt, mm1 = _keys_product(g, keys, fail, "the keys'")
    mul = g.only_reader(mm1.output[0])
    if mul is None or mul.op_type != "Mul":
        fail("the scores are not scaled by one Mul")
    other = mul.input[1] if mul.input[0] == mm1.output[0] else mul.input[0]
    scale = _scalar(g, other)
    if scale is None:
        fail("the scores' scale is not a constant")
    add, mask, sm = _masked_softmax(g, mul.output[0], fail, "scaled")
    mm2 = g.only_reader(sm.output[0])
    if mm2 is None or mm2.op_type != "MatMul" or mm2.input[1] != values:
        fail("the probabilities are not read by one MatMul with the values")
    return Chain(mm1.input[0], mask, scale, mm2.output[0], [kt, mm1, mul, add, sm, mm2])


def buffer_chain(g: GraphIndex, keys: str, values: str, fail) -> Chain:
    """The buffer flavour's chain over the buffer `keys` / `values` (its queries scaled before the products):

        s = Concat(MatMul(q, Transpose(keys)), MatMul(q, Transpose(k_new)));  p = Softmax(Add(s, mask))
        y = MatMul(Slice(p, buffer), values) + MatMul(Slice(p, new), v_new)
    """
    kt, mm1 = _keys_product(g, keys, fail, "the buffer keys'")
    cat = g.only_reader(mm1.output[0])
    if cat is None or cat.op_type != "Concat" or len(cat.input) != 2 or cat.input[0] != mm1.output[0]:
        fail("the buffer's scores are not joined to the new entries' by one Concat")
    mm_new = g.op(cat.input[1], "MatMul")
    kt_new = g.op(mm_new.input[1], "Transpose") if mm_new is not None else None
    if kt_new is None or mm_new.input[0] != mm1.input[0]:
        fail("the new entries' scores are not the same queries times their transposed keys")
    add, mask, sm = _masked_softmax(g, cat.output[0], fail, "joined")
    slices = g.readers.get(sm.output[0], [])
    if len(slices) != 2 or any(x.op_type != "Slice" for x in slices):
        fail("the probabilities are not split by two Slices")
    mms = [g.only_reader(x.output[0]) for x in slices]
    if any(m is None or m.op_type != "MatMul" for m in mms):
        fail("a part of the probabilities is not read by one MatMul")
    mm_buf = [m for m in mms if m.input[1] == values]
    mm_vn = [m for m in mms if m.input[1] != values]
    if len(mm_buf) != 1 or len(mm_vn) != 1:
        fail("the probabilities do not meet the buffer's values and the new values once each")
    yadd = g.only_reader(mm_buf[0].output[0])
    if yadd is None or yadd.op_type != "Add" or set(yadd.input) != {mm_buf[0].output[0], mm_vn[0].output[0]}:
        fail("the two value products are not summed by one Add")
    nodes = [kt, mm1, kt_new, mm_new, cat, add, sm, *slices, *mms, yadd]
    return Chain(mm1.input[0], mask, 1.0, yadd.output[0], nodes, k_new=kt_new.input[0], v_new=mm_vn[0].input[1])


def chain(g: GraphIndex, cache_io: str, keys: str, values: str, fail) -> Chain:
    """The layer's chain in this flavour (concat: over the present; buffer: over the buffer and the new entries)."""
    return buffer_chain(g, keys, values, fail) if cache_io == "buffer" else attention_chain(g, keys, values, fail)


def fuse_float(onnx_path: str, plan) -> dict:
    """Rewrite the float32-cache graph at onnx_path in place: each layer's chain as one DecodeAttention node. Returns
    export_info.json's "attention_op" entry."""
    import os

    import onnx
    why = attention_op_refusal(plan.cache_io)
    if why:
        raise ExportError(why)
    model = onnx.load(onnx_path, load_external_data=False)
    graph = model.graph
    g = GraphIndex(graph)
    replace, drop = {}, set()
    for i, names in enumerate(plan.cache_names):
        def fail(what, i=i):
            raise ExportError(f"--attention-op fused: layer {i}: {what}; the graph is not the layout the rewrite "
                              "knows")
        where = "present" if plan.cache_io == "concat" else "past_key_values"
        k, v = f"{where}.{i}.{names[0]}", f"{where}.{i}.{names[1]}"
        c = chain(g, plan.cache_io, k, v, fail)
        replace[id(c.nodes[-1])] = [c.node([k, v], False, f"fused_attention.{i}")]
        drop |= {id(n) for n in c.nodes[:-1]}
    splice_nodes(graph, replace, drop)
    prune_dead_nodes(graph)
    drop_unread_initializers(graph)
    add_domain(model)
    _save_checked(model, onnx_path)
    return info("float32")


def add_domain(model) -> None:
    from onnx import helper

    if not any(o.domain == DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(DOMAIN, 1))


def info(cache: str) -> dict:
    return dict(op="fused", domain=DOMAIN, node="DecodeAttentionInt8" if cache == "int8" else "DecodeAttention",
                library=LIBRARY_FILE, isa_choice="CPUID at load (AVX-512, AVX2 or x86-64 baseline), or "
                "VHA_ATTENTION_ISA")


def ship_library(out_dir: str, entry: dict, log) -> dict:
    """Copies the built library into the export folder and names it in genai_config.json (when the folder has one);
    returns the export_info entry."""
    import json
    import os
    import shutil

    from ..serve.ort_ops import OrtOpsUnavailable, library_path

    try:
        shutil.copyfile(library_path(), os.path.join(out_dir, LIBRARY_FILE))
    except OrtOpsUnavailable as e:
        raise ExportError(f"--attention-op fused: {e}") from None
    genai = os.path.join(out_dir, "genai_config.json")
    if os.path.isfile(genai):
        with open(genai, encoding="utf-8") as f:
            cfg = json.load(f)
        cfg["model"]["decoder"].setdefault("session_options", {})["custom_ops_library"] = LIBRARY_FILE
        with open(genai, "w", encoding="utf-8") as f:
            json.dump(cfg, f, indent=2)
        log(f"onnxruntime-genai: genai_config.json names {LIBRARY_FILE} (session_options.custom_ops_library)")
    return dict(entry, library=LIBRARY_FILE)


def _save_checked(model, onnx_path: str) -> None:
    import os

    import onnx

    with open(onnx_path + ".tmp", "wb") as f:
        f.write(model.SerializeToString())
    try:
        onnx.checker.check_model(onnx_path + ".tmp")
    except onnx.checker.ValidationError as e:
        os.remove(onnx_path + ".tmp")
        raise ExportError(f"--attention-op fused: the rewritten graph fails onnx.checker: "
                          f"{str(e).splitlines()[0][:300]}")
    os.replace(onnx_path + ".tmp", onnx_path)
