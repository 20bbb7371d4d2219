"""Weight-only quantization of an exported decoder with onnxruntime's own block quantizer (MatMulNBits' kernel).

`--weights int8 / int4` rewrites every MatMul whose right operand is a constant (q/k/v/o, gate/up/down, the LM head)
into onnxruntime's MatMulNBits (contrib domain com.microsoft): the weight stored in blocks of `block_size` values
along the input axis, each block with its own float32 scale (symmetric: no zero point, like llama.cpp's Q8_0 /
Q4_0), multiplied at accuracy_level 4 (activations quantized to int8 per block, int8 dot products: ACCURACY_LEVEL).
Everything else stays float32: the embedding Gather (a step reads one row of
it), the RMSNorm weights (input / post-attention / final, and Qwen3's q_norm / k_norm, which are Mul constants the
quantizer never touches: tests/test_export_quant.py checks they are there, float32 and used), attention and the KV
cache.

Before quantizing, q|k|v and gate|up are merged into one MatMul each (export/merge_matmuls.py: exact, the same blocks
and scales per output column) and the residual + RMSNorm and rotary chains become onnxruntime's contrib fused ops
(export/fuse_contrib.py): a quantized graph is onnxruntime's own already, and a batch-1 step is mostly small kernels
around the MatMuls. The float32 export stays standard ONNX. Those rewrites run on the graph with its weights still in
model.onnx.data (export/lazy_weights.py: protobuf frees no field's bytes before the whole message); then each weight
is read from there alone and quantized by onnxruntime's kernel, column block by column block (`quantize_matmuls`:
the nodes and bytes MatMulNBitsQuantizer writes), and only what stays float32 is read into the graph at the end. The
peak is the quantized weights plus the float32 embedding plus a 64 MB block's working copies: Qwen3-0.6B int8 4.47 GB
in all (6.89 GB with MatMulNBitsQuantizer over the whole graph in memory), Qwen3-1.7B below its float32 validation.

The tied LM head (tie_word_embeddings: logits = x @ embed^T) reads the embedding through Transpose nodes, which the
quantizer skips (it only takes a constant operand). `untie_lm_head` gives that MatMul its own constant, the
transposed embedding, before quantization, so the head is quantized too; the embedding stays float32 for the
Gather. Measured (docs/deploy.md): at Qwen3-0.6B the head is 26% of the float32 weights a batch-1 step reads, and
quantizing it costs little KL; `quantize_lm_head=False` keeps it float32 instead.

float16 / bfloat16 are refused (FLOAT_REFUSAL): onnxruntime 1.32's CPU execution provider has no bfloat16 kernels
and, on this x86 CPU, no float16 MatMul: it inserts Casts and folds the float16 weights back to float32 at session
creation (the optimized graph's initializers are float32), so a step reads the same bytes as the float32 export.
"""
from __future__ import annotations

import logging
import os
from typing import Optional

import numpy as np

from .errors import ExportError
from .fuse_contrib import fuse_contrib_ops
from .merge_matmuls import merge_sibling_matmuls
from .lazy_weights import LazyWeights
from .node_edit import GraphIndex, drop_unread_initializers, prune_dead_nodes
from .weights import DATA_FILE, needs_external_data

__all__ = ["WEIGHT_FORMATS", "BITS", "DEFAULT_BLOCK_SIZE", "BLOCK_SIZES", "FLOAT_REFUSAL", "check_weights",
           "quantize_graph",
           "untie_lm_head", "QUANT_OPS", "node_quantizer", "quantize_matmuls"]

WEIGHT_FORMATS = ("fp32", "fp16", "bf16", "int8", "int4")
BITS = {"int8": 8, "int4": 4}
# The one block-size recommendation (docs/deploy.md, "Which format to pick"): 128, the default. Measured there: int4
# at block 128 decodes 1.10-1.41x block 32's tokens/s at batch 1 on the three CPUs (it reads 0.53 bytes a weight,
# block 32's float32 scales make it 0.625), for a quality cost of mean KL 1.05e-2 vs 8.1e-3 nats on the trained demo
# model (agreement 98.7% vs 100%).
DEFAULT_BLOCK_SIZE = 128
BLOCK_SIZES = (16, 32, 64, 128, 256)  # what onnxruntime 1.32's block quantizer takes (check_weights asks it itself)
# MatMulNBits' accuracy_level 4: the activations quantized to int8 per block and multiplied by int8 kernels. On this
# AVX2 CPU (ORT 1.32, 16 MatMuls of 1024 x 3072, batch 1, loaded machine) fp32 92 ms; int4 31 ms at level 4, 94 ms
# at level 0 (float compute); int8 55 ms at level 4, 1,679 ms at level 0. The quality gate measures its cost too.
ACCURACY_LEVEL = 4
# the contrib ops a quantized graph may hold (domain com.microsoft): the quantized MatMuls, and the fused chains of
# export/fuse_contrib.py
QUANT_OPS = ("MatMulNBits", "RotaryEmbedding", "SkipSimplifiedLayerNormalization")
FLOAT_REFUSAL = ("onnxruntime 1.32's CPU execution provider runs no bfloat16 kernels and, on x86, no float16 MatMul: "
                 "it casts float16 weights back to float32 when it loads the graph, so a step reads what float32 "
                 "reads; use --weights int8 (or int4) for fewer bytes per step")


def check_weights(weights: str, block_size: Optional[int]) -> None:
    """ExportError (one line) for a weight format or block size the export does not write. The block size is tried on
    onnxruntime's own block quantizer (the kernel the export calls later, on one block of ones, in microseconds), so
    whatever that backend refuses is refused here, before any work, with its own words."""
    if weights in ("fp16", "bf16"):
        raise ExportError(f"--weights {weights}: refused: {FLOAT_REFUSAL}")
    if weights not in ("fp32",) + tuple(BITS):
        raise ExportError(f"--weights {weights!r}: expected one of fp32, int8, int4")
    if block_size is not None and weights == "fp32":
        raise ExportError("--block-size applies to --weights int8 / int4 only")
    if weights in BITS:
        block = DEFAULT_BLOCK_SIZE if block_size is None else block_size
        if not (isinstance(block, int) and block >= 1):
            raise ExportError(f"--block-size {block}: must be a positive integer")
        try:
            node_quantizer(weights, block).qbits_block_quant(np.ones((block, 1), np.float32))
        except RuntimeError as e:  # MLAS: "... Only block sizes 16, 32, 64, 128, 256 are supported for quantization"
            said = str(e).strip().splitlines()[0]
            said = said.split("false was false.")[-1].strip() or said
            raise ExportError(f"--block-size {block}: onnxruntime's block quantizer refuses it ({said})") from None


def node_quantizer(weights: str, block_size: int):
    """onnxruntime's weight-only quantizer of one MatMul (DefaultWeightOnlyQuantizer, its DEFAULT round to nearest):
    symmetric blocks of `block_size`, float32 scales, ACCURACY_LEVEL; what MatMulNBitsQuantizer runs per node."""
    from onnxruntime.quantization.matmul_nbits_quantizer import (DefaultWeightOnlyQuantConfig,
                                                                 DefaultWeightOnlyQuantizer)

    logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer").setLevel(logging.WARNING)  # INFO per node
    return DefaultWeightOnlyQuantizer(DefaultWeightOnlyQuantConfig(
        block_size=block_size, is_symmetric=True, accuracy_level=ACCURACY_LEVEL, bits=BITS[weights]))


def untie_lm_head(model, weights: Optional[LazyWeights] = None) -> Optional[str]:
    """If the MatMul producing `logits` reads the embedding through Transpose nodes (a tied head), give it a constant
    of its own, the transposed embedding (hidden, vocab); returns that initializer's name, or None (untied: the
    head already has its own constant). `weights`: as for merge_sibling_matmuls (the new constant a recipe)."""
    import onnx

    graph = model.graph
    store = weights if weights is not None else LazyWeights(model)
    g = GraphIndex(graph)
    inits, made = g.inits, g.made
    head = made.get("logits")
    if head is None or head.op_type != "MatMul" or head.input[1] in inits:
        return None
    perm_count, src = 0, head.input[1]
    while src in made and made[src].op_type == "Transpose":  # paddle2onnx may chain two (a no-op pair plus one)
        node = made[src]
        perm = [a.ints for a in node.attribute if a.name == "perm"]
        if perm and list(perm[0]) not in ([1, 0],):
            return None
        perm_count, src = perm_count + 1, node.input[0]
    if src not in inits or perm_count % 2 != 1:
        return None
    emb = inits[src]
    if not store.is_matrix(emb, onnx.TensorProto.FLOAT):
        return None
    v, h = emb.dims
    table = store.array(emb)  # (V, h): the embedding

    name = "lm_head.weight.untied"
    store.add(name, onnx.TensorProto.FLOAT, [h, v], lambda: table.T)  # (h, V): the head's own constant, a view
    # of the embedding (copied where it is used: quantized column block by column block, or materialized)
    head.input[1] = name
    if weights is None:
        store.materialize()
    return name


def load_inline(onnx_path: str):
    """The graph at onnx_path with every external-data tensor read into it, one tensor at a time (onnx.load's own
    external-data loading holds about twice the weights at its peak; this, the weights plus one tensor)."""
    import onnx

    model = onnx.load(onnx_path, load_external_data=False)
    LazyWeights(model, os.path.dirname(onnx_path) or ".").materialize()
    return model


def quantize_graph(onnx_path: str, weights: str, block_size: Optional[int] = None, quantize_lm_head: bool = True,
                   external_data: bool = False, max_positions: Optional[int] = None) -> dict:
    """Rewrite the float32 decoder at `onnx_path` (and its model.onnx.data) in place as `weights` ("int8" / "int4"):
    onnxruntime's MatMulNBitsQuantizer (symmetric blocks of `block_size`, float32 scales) over every constant MatMul.
    The result goes to external data when it would pass protobuf's limit inline, or when `external_data`. Returns
    what was done (for export_info.json). Before quantizing: sibling MatMuls merged (export/merge_matmuls.py) and
    residual + RMSNorm chains fused; with max_positions (the rotary tables' rows: the model's max_position_embeddings)
    rotary chains fused too (export/fuse_contrib.py)."""
    import onnx

    bits, block = BITS[weights], block_size or DEFAULT_BLOCK_SIZE
    model = onnx.load(onnx_path, load_external_data=False)  # the graph; its weights stay in the data file ...
    store = LazyWeights(model, os.path.dirname(onnx_path) or ".")
    untied = untie_lm_head(model, store) if quantize_lm_head else None
    prune_dead_nodes(model.graph)  # the tied head's Transposes, once untied
    merged = merge_sibling_matmuls(model, store)  # q/k/v and gate/up: one MatMul (then a Split) each, exact
    fused = fuse_contrib_ops(model, max_positions, store)  # rotary (when max_positions), residual + RMSNorm
    drop_unread_initializers(model.graph)
    head = next(n for n in model.graph.node if "logits" in n.output)
    exclude = set() if quantize_lm_head else {head.name or _name_node(head, "lm_head")}
    quantize_matmuls(model, store, node_quantizer(weights, block), exclude)  # ... read one at a time, quantized
    drop_unread_initializers(model.graph)  # the float32 weights now quantized: never read in
    store.materialize()  # what stays float32 (the embedding for the Gather, the norms, a float head), read in once
    counts = {}
    for n in model.graph.node:
        if n.op_type in ("MatMul", "MatMulNBits") and any(t.name == n.input[1] for t in model.graph.initializer):
            counts[n.op_type] = counts.get(n.op_type, 0) + 1
    odd = sorted({f"{n.domain}::{n.op_type}" for n in model.graph.node
                  if n.domain not in ("", "ai.onnx") and (n.domain, n.op_type) not in {("com.microsoft", o)
                                                                                       for o in QUANT_OPS}})
    if odd:
        raise ExportError(f"the quantized graph holds ops other than standard ONNX and {', '.join(QUANT_OPS)}: "
                          f"{', '.join(odd)}")
    ops = sorted({n.op_type for n in model.graph.node})
    for stale in (onnx_path, os.path.join(os.path.dirname(onnx_path), DATA_FILE)):
        if os.path.exists(stale):
            os.remove(stale)
    weight_bytes = sum(len(t.raw_data) for t in model.graph.initializer)
    external = bool(external_data) or needs_external_data(weight_bytes, 4 << 20)
    onnx.save_model(model, onnx_path, save_as_external_data=external, all_tensors_to_one_file=True,
                    location=DATA_FILE, size_threshold=1024)
    return dict(format=weights, bits=bits, block_size=block, symmetric=True, accuracy_level=ACCURACY_LEVEL,
                quantizer="onnxruntime DefaultWeightOnlyQuantizer per MatMul (MatMulNBitsQuantizer's DEFAULT, round to "
                "nearest)", lm_head=weights if quantize_lm_head else "float32",
                tied_head_untied=bool(untied), merged_matmul_groups=merged, fused=fused,
                max_positions=max_positions if fused["rotary_embedding"] else None,
                quantized_matmuls=counts.get("MatMulNBits", 0),
                float_matmuls=counts.get("MatMul", 0), weight_bytes=weight_bytes, external_data=external, ops=ops)


CHUNK_BYTES = 64 << 20  # float32 columns quantized at a time: blocks run along K, so columns are independent


def quantize_matmuls(model, store: LazyWeights, quantizer, exclude=frozenset()) -> int:
    """Every MatMul of `model` reading a 2-D float32 initializer (not in `exclude`, by node name) rewritten into
    onnxruntime's MatMulNBits; returns how many. The blocks and scales come from onnxruntime's own kernel
    (`quantizer.qbits_block_quant`, `node_quantizer`), the node and its two initializers are the ones
    MatMulNBitsQuantizer writes for a 2-D weight (tests/test_export_quant.py compares them byte for byte). Each weight
    is read from `store` (external data, or a rewrite's recipe) column block by column block (CHUNK_BYTES: a column's
    blocks run along K, so columns quantize independently) and released once quantized: the float32 weights are never
    all in memory, nor is a large one (the LM head) copied whole. MatMulNBitsQuantizer over a graph holding them
    inline keeps every float32 weight and every quantized one until it ends, and protobuf frees neither before the
    whole graph: Qwen3-0.6B int8 peaked at 2.8x its float32 weights that way."""
    import onnx
    from onnx import helper, numpy_helper

    cfg = quantizer.config
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    nodes, count = [], 0
    for node in graph.node:
        w = inits.get(node.input[1]) if node.op_type == "MatMul" and len(node.input) == 2 else None
        if w is None or node.name in exclude or not store.is_matrix(w, onnx.TensorProto.FLOAT):
            nodes.append(node)
            continue
        k, n = (int(d) for d in w.dims)
        weight = store.array(w)  # (K, N): a map of the data file, or a recipe's array (a view where it can be)
        step = max(1, CHUNK_BYTES // (4 * k))
        parts = [quantizer.qbits_block_quant(np.ascontiguousarray(weight[:, c:c + step], np.float32))[:2]
                 for c in range(0, n, step)]  # (packed (cols, k_blocks, blob) uint8, scales (cols, k_blocks))
        del weight
        store.release(w.name)
        packed = np.concatenate([p for p, _ in parts]) if len(parts) > 1 else parts[0][0]
        scales = np.concatenate([s for _, s in parts]) if len(parts) > 1 else parts[0][1]
        del parts
        graph.initializer.extend([numpy_helper.from_array(packed, f"{w.name}_Q{cfg.bits}"),
                                  numpy_helper.from_array(scales, f"{w.name}_scales")])
        del packed, scales
        attrs = dict(K=k, N=n, bits=cfg.bits, block_size=cfg.block_size)
        if cfg.accuracy_level:
            attrs["accuracy_level"] = cfg.accuracy_level
        nodes.append(helper.make_node("MatMulNBits", [node.input[0], f"{w.name}_Q{cfg.bits}", f"{w.name}_scales"],
                                      [node.output[0]], name=f"{node.name}_Q{cfg.bits}" if node.name else "",
                                      domain="com.microsoft", **attrs))
        count += 1
    del graph.node[:]
    graph.node.extend(nodes)
    if not any(o.domain == "com.microsoft" for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    return count


def _name_node(node, name: str) -> str:
    node.name = name
    return name
