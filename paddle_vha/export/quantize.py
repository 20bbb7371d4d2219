"""Weight-only quantization of an exported decoder into onnxruntime's stock contrib ops (MatMulNBits, and
GatherBlockQuantized for the embedding).

`--weights int8 / int4` rewrites every MatMul whose right operand is a constant (q/k/v/o, gate/up/down, the LM head)
into onnxruntime's MatMulNBits (contrib domain com.microsoft): the weight stored in blocks of `block_size` values
along the input axis, each block with a float32 scale and (except for the `rtn` recipe) a uint8 zero point, fitted by
the spec's recipe (export/blockquant.py; `rtn` is onnxruntime's own round to nearest), in 4 or 8 bits per weight
(export/quant_plan.py: a mixed int4 export stores the roles of its rule in 8 bits), multiplied at accuracy_level 4
(activations quantized to int8 per block, int8 dot products: ACCURACY_LEVEL). With spec.quantize_embedding the
embedding Gather becomes GatherBlockQuantized over the tied head's own codes (quantize_embedding). What stays float32:
the RMSNorm weights (input / post-attention / final, and Qwen3's q_norm / k_norm, which are Mul constants the
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
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

import numpy as np

from .blockquant import RECIPES, Recipe, pack_codes, pack_zero_points, quantize_blocks
from .errors import ExportError
from .fuse_contrib import fuse_contrib_ops
from .merge_matmuls import merge_sibling_matmuls
from .lazy_weights import LazyWeights
from .node_edit import GraphIndex, drop_unread_initializers, prune_dead_nodes
from .quant_plan import bits_for, parse_rule, role_of
from .weights import DATA_FILE, needs_external_data

__all__ = ["WEIGHT_FORMATS", "BITS", "DEFAULT_BLOCK_SIZE", "BLOCK_SIZES", "FLOAT_REFUSAL", "check_weights",
           "quantize_graph",
           "untie_lm_head", "QUANT_OPS", "node_quantizer", "quantize_matmuls", "QuantSpec", "quantize_embedding", "default_spec",
           "DEFAULT_RECIPE", "DEFAULT_BLOCK"]

WEIGHT_FORMATS = ("fp32", "fp16", "bf16", "int8", "int4")
BITS = {"int8": 8, "int4": 4}
# QuantSpec's block when none is named (the old round-to-nearest default; what `quantize_graph(path, "int4")` writes).
# --weights int4 / int8 take default_spec's DEFAULT_BLOCK (32) instead: docs/deploy.md, "The block size".
DEFAULT_BLOCK_SIZE = 128
BLOCK_SIZES = (16, 32, 64, 128, 256)  # what onnxruntime 1.32's block quantizer takes (check_weights asks it itself)
# MatMulNBits' accuracy_level 4: the activations quantized to int8 per block and multiplied by int8 kernels. On this
# AVX2 CPU (ORT 1.32, 16 MatMuls of 1024 x 3072, batch 1, loaded machine) fp32 92 ms; int4 31 ms at level 4, 94 ms
# at level 0 (float compute); int8 55 ms at level 4, 1,679 ms at level 0. The quality gate measures its cost too.
ACCURACY_LEVEL = 4
# the contrib ops a quantized graph may hold (domain com.microsoft): the quantized MatMuls, and the fused chains of
# export/fuse_contrib.py
QUANT_OPS = ("MatMulNBits", "GatherBlockQuantized", "RotaryEmbedding", "SkipSimplifiedLayerNormalization")
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


@dataclass(frozen=True)
class QuantSpec:
    """What `--weights int8 / int4` writes: `weights` and `block_size` (values per block along K); `recipe` (how a
    block is fitted: RECIPES in export/blockquant.py, or "rtn", onnxruntime's own symmetric round to nearest);
    `mixed` (quant_plan.py's rule: the roles stored in 8 bits in a 4-bit export); `quantize_embedding` (the
    embedding table quantized too, read by GatherBlockQuantized; a tied table shared with the LM head's MatMulNBits);
    `quantize_lm_head`; `accuracy_level` (MatMulNBits': 4 quantizes the activations to int8 per block, 0 computes in
    float32, ~30x slower on this CPU)."""

    weights: str
    block_size: int = DEFAULT_BLOCK_SIZE
    recipe: str = "rtn"
    mixed: Tuple[str, ...] = ()
    quantize_embedding: bool = False
    quantize_lm_head: bool = True
    accuracy_level: int = ACCURACY_LEVEL
    block_size_8: Optional[int] = None  # the 8-bit weights' block in a mixed int4 export (block_size when None)
    symmetric_8: bool = False  # the 8-bit weights of a mixed int4 export without zero points (the recipe otherwise)

    @property
    def bits(self) -> int:
        return BITS[self.weights]

    def recipe_for(self, bits: int) -> Recipe:
        """How a weight stored in `bits` is fitted: the spec's recipe, symmetric for the 8-bit weights of a mixed int4
        export when symmetric_8."""
        r = RECIPES[self.recipe]
        if bits == 8 and self.bits == 4 and self.symmetric_8 and r.asymmetric:
            return Recipe(r.name + "-symmetric", asymmetric=False, search=r.search, weighted=r.weighted)
        return r

    def block_for(self, bits: int) -> int:
        """Values per block of a weight stored in `bits`."""
        return self.block_size_8 or self.block_size if bits == 8 and self.bits == 4 else self.block_size

    def describe(self) -> str:
        how = ("onnxruntime's symmetric round to nearest" if self.recipe == "rtn" else RECIPES[self.recipe].describe())
        sym = ", symmetric" if self.symmetric_8 else ""
        mixed = (f"; 8 bits (blocks of {self.block_for(8)}{sym}) for {', '.join(self.mixed)}"
                 if self.mixed and self.bits == 4 else "")
        emb = "; embedding quantized" if self.quantize_embedding else ""
        return f"{self.weights} blocks of {self.block_size}, {how}{mixed}{emb}"


# What --weights int4 / int8 write by default: the recipe measured best per byte on SmolLM2-135M-Instruct against
# llama.cpp (docs/deploy.md, "Quantized exports on a real model"). `rtn` at block 128 (the old default) stays
# reachable: --quant-recipe rtn --block-size 128 --mixed none --float-embedding.
DEFAULT_RECIPE = {"int4": "awq", "int8": "awq"}
DEFAULT_BLOCK = {"int4": 32, "int8": 32}
DEFAULT_BLOCK_8 = 64  # the 8-bit weights of a mixed int4 export: blocks of 64, symmetric (their zero points and
# block-32 scales bought nothing measurable on SmolLM2 for 1.9 MB: 116.2 -> 114.9 MB at KL 0.0559 -> 0.0556)


def default_spec(weights: str, block_size: Optional[int] = None, recipe: Optional[str] = None,
                 mixed: Optional[Tuple[str, ...]] = None, quantize_embedding: bool = True,
                 quantize_lm_head: bool = True) -> "QuantSpec":
    """The QuantSpec of `--weights int4 / int8` with the user's choices (None: the format's default) in place."""
    from .quant_plan import MIXED_DEFAULT

    block = block_size or DEFAULT_BLOCK[weights]
    return QuantSpec(weights, block, recipe or DEFAULT_RECIPE[weights],
                     tuple(MIXED_DEFAULT if mixed is None else mixed) if weights == "int4" else (),
                     quantize_embedding=quantize_embedding, quantize_lm_head=quantize_lm_head,
                     block_size_8=max(block, DEFAULT_BLOCK_8) if weights == "int4" else None,
                     symmetric_8=weights == "int4")


def quantize_graph(onnx_path: str, weights, block_size: Optional[int] = None, quantize_lm_head: bool = True,
                   external_data: bool = False, max_positions: Optional[int] = None,
                   sources: Optional[Dict[str, str]] = None, importance: Optional[Dict[str, np.ndarray]] = None,
                   num_layers: Optional[int] = None) -> dict:
    """Rewrite the float32 decoder at `onnx_path` (and its model.onnx.data) in place as `weights`: a QuantSpec, or
    "int8" / "int4" (onnxruntime's round to nearest in blocks of `block_size`, the old default). Every constant
    MatMul becomes a MatMulNBits; with spec.quantize_embedding the embedding Gather a GatherBlockQuantized.
    `sources` ({initializer: checkpoint tensor}, export_info.json's weight_sources) gives each weight its role for
    spec.mixed; `importance` ({activation: E[x^2]}, export/calibration.py) weighs the fits of an activation-aware
    recipe. The result goes to external data when it would pass protobuf's limit inline, or when `external_data`.
    Returns what was done (for export_info.json). Before quantizing: sibling MatMuls of the same bits merged
    (export/merge_matmuls.py) and residual + RMSNorm chains fused; with max_positions (the rotary tables' rows: the
    model's max_position_embeddings) rotary chains fused too (export/fuse_contrib.py)."""
    import onnx

    spec = weights if isinstance(weights, QuantSpec) else QuantSpec(
        weights, block_size or DEFAULT_BLOCK_SIZE, quantize_lm_head=quantize_lm_head)
    model = onnx.load(onnx_path, load_external_data=False)  # the graph; its weights stay in the data file ...
    store = LazyWeights(model, os.path.dirname(onnx_path) or ".")
    sources = dict(sources or {})
    embed = _embedding_gather(model.graph) is not None
    untied = untie_lm_head(model, store) if spec.quantize_lm_head else None
    if untied:
        sources[untied] = "lm_head.weight (tied: the embedding)"
    layers = num_layers if num_layers is not None else 1 + max(
        [r.layer for r in map(role_of, sources.values()) if r is not None and r.layer is not None] or [0])
    bits = bits_for(sources, spec.bits, parse_rule(spec.mixed), layers)
    prune_dead_nodes(model.graph)  # the tied head's Transposes, once untied
    members: Dict[str, list] = {}
    merged = merge_sibling_matmuls(model, store, key=lambda w: bits.get(w, spec.bits), members=members)
    for name, parts in members.items():
        bits[name] = bits.get(parts[0], spec.bits)
    fused = fuse_contrib_ops(model, max_positions, store)  # rotary (when max_positions), residual + RMSNorm
    drop_unread_initializers(model.graph)
    head = next(n for n in model.graph.node if "logits" in n.output)
    exclude = set() if spec.quantize_lm_head else {head.name or _name_node(head, "lm_head")}
    written = quantize_matmuls(model, store, spec, exclude, bits=bits, importance=importance)  # ... one at a time
    embedding = None
    if spec.quantize_embedding and embed:
        shared = written.get(untied) if untied else None
        embedding = quantize_embedding(model, store, spec, shared, bits.get(untied, spec.bits) if shared
                                       else _embed_bits(sources, bits, spec), importance)
    drop_unread_initializers(model.graph)  # the float32 weights now quantized: never read in
    store.materialize()  # what stays float32 (the norms, a float head or embedding), read in once
    counts = {}
    for n in model.graph.node:
        if n.op_type in ("MatMul", "MatMulNBits") and any(t.name == n.input[1] for t in model.graph.initializer):
            key = n.op_type if n.op_type == "MatMul" else f"MatMulNBits{_attr(n, 'bits')}"
            counts[key] = counts.get(key, 0) + 1
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
    eight = sorted({sources.get(w, w) for w, b in bits.items() if b == 8 and w in sources}) if spec.bits == 4 else []
    return dict(format=spec.weights, bits=spec.bits, block_size=spec.block_size, recipe=spec.recipe,
                recipe_text=spec.describe(), symmetric=spec.recipe == "rtn" or not RECIPES[spec.recipe].asymmetric,
                accuracy_level=spec.accuracy_level, mixed_rule=list(spec.mixed) if spec.bits == 4 else [],
                eight_bit_weights=eight, activation_weighted=bool(importance) and spec.recipe != "rtn" and
                RECIPES[spec.recipe].weighted,
                quantizer=("onnxruntime DefaultWeightOnlyQuantizer per MatMul (MatMulNBitsQuantizer's DEFAULT, round to "
                           "nearest)" if spec.recipe == "rtn" else "paddle_vha.export.blockquant"),
                lm_head=spec.weights if spec.quantize_lm_head else "float32", embedding=embedding or "float32",
                tied_head_untied=bool(untied), merged_matmul_groups=merged, fused=fused,
                max_positions=max_positions if fused["rotary_embedding"] else None,
                quantized_matmuls=sum(v for k, v in counts.items() if k.startswith("MatMulNBits")),
                quantized_matmuls_by_bits={k[len("MatMulNBits"):]: v for k, v in counts.items()
                                           if k.startswith("MatMulNBits")},
                float_matmuls=counts.get("MatMul", 0), weight_bytes=weight_bytes, external_data=external, ops=ops)


def _attr(node, name, default=None):
    for a in node.attribute:
        if a.name == name:
            return a.i
    return default


def _embedding_gather(graph):
    """The Gather reading the embedding table (V, h) with the input ids, or None."""
    inits = {t.name for t in graph.initializer}
    for n in graph.node:
        if n.op_type == "Gather" and n.input[0] in inits and n.input[1] == "input_ids":
            return n
    return None


def _embed_bits(sources, bits, spec) -> int:
    """The embedding table's bits when it is quantized on its own (an untied model): its role's."""
    name = next((w for w, s in sources.items() if s == "model.embed_tokens.weight"), None)
    return bits.get(name, spec.bits)


CHUNK_BYTES = 64 << 20  # float32 columns quantized at a time: blocks run along K, so columns are independent


def _fit(weight, spec: QuantSpec, bits: int, importance):
    """(packed codes (N, k_blocks, blob) uint8, scales (N, k_blocks) float32, zero points packed (N, ...) uint8 or
    None, zero points unpacked (N, k_blocks) or None) of `weight` (K, N) by the spec's recipe, column block by column
    block."""
    k, n = weight.shape
    step = max(1, CHUNK_BYTES // (4 * k))
    if spec.recipe == "rtn":
        quantizer = node_quantizer("int8" if bits == 8 else "int4", spec.block_for(bits))
        parts = [quantizer.qbits_block_quant(np.ascontiguousarray(weight[:, c:c + step], np.float32))[:2]
                 for c in range(0, n, step)]  # (packed (cols, k_blocks, blob) uint8, scales (cols, k_blocks))
        packed = np.concatenate([p for p, _ in parts]) if len(parts) > 1 else parts[0][0]
        scales = np.concatenate([s for _, s in parts]) if len(parts) > 1 else parts[0][1]
        return packed, scales.astype(np.float32), None, None
    packed, scales, zp, zu = [], [], [], []
    for c in range(0, n, step):
        qb = quantize_blocks(weight[:, c:c + step], bits, spec.block_for(bits), spec.recipe_for(bits), importance)
        packed.append(pack_codes(qb))
        scales.append(qb.scales)
        if qb.zero_points is not None:
            zp.append(pack_zero_points(qb))
            zu.append(qb.zero_points)
    cat = (lambda parts: np.concatenate(parts) if len(parts) > 1 else parts[0])  # noqa: E731
    return cat(packed), cat(scales), (cat(zp) if zp else None), (cat(zu) if zu else None)


def quantize_matmuls(model, store: LazyWeights, spec, exclude=frozenset(), bits: Optional[Dict[str, int]] = None,
                     importance: Optional[Dict[str, np.ndarray]] = None) -> Dict[str, tuple]:
    """Every MatMul of `model` reading a 2-D float32 initializer (not in `exclude`, by node name) rewritten into
    onnxruntime's MatMulNBits, in `bits[weight]` bits (the spec's otherwise), fitted by the spec's recipe (importance
    of the MatMul's input where the recipe weighs by it); returns {weight name: (codes name, scales, zero points
    unpacked or None, bits)} of each weight quantized. `spec` may be onnxruntime's quantizer (node_quantizer's: the
    old call). Each weight is read from `store` (external data, or a rewrite's recipe) column block by column block
    (CHUNK_BYTES: a column's blocks run along K, so columns quantize independently) and released once quantized: the
    float32 weights are never all in memory, nor is a large one (the LM head) copied whole. MatMulNBitsQuantizer over
    a graph holding them inline keeps every float32 weight and every quantized one until it ends, and protobuf frees
    neither before the whole graph: Qwen3-0.6B int8 peaked at 2.8x its float32 weights that way."""
    import onnx
    from onnx import helper, numpy_helper

    if not isinstance(spec, QuantSpec):  # onnxruntime's quantizer object
        cfg = spec.config
        spec = QuantSpec("int8" if cfg.bits == 8 else "int4", cfg.block_size, accuracy_level=cfg.accuracy_level)
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    nodes, written = [], {}
    for node in graph.node:
        w = inits.get(node.input[1]) if node.op_type == "MatMul" and len(node.input) == 2 else None
        if w is None or node.name in exclude or not store.is_matrix(w, onnx.TensorProto.FLOAT):
            nodes.append(node)
            continue
        k, n = (int(d) for d in w.dims)
        nbits = (bits or {}).get(w.name, spec.bits)
        weight = store.array(w)  # (K, N): a map of the data file, or a recipe's array (a view where it can be)
        imp = (importance or {}).get(node.input[0])
        packed, scales, zp, zu = _fit(weight, spec, nbits, imp)
        del weight
        store.release(w.name)
        names = [f"{w.name}_Q{nbits}", f"{w.name}_scales"] + ([f"{w.name}_zp"] if zp is not None else [])
        graph.initializer.extend([numpy_helper.from_array(packed, names[0]), numpy_helper.from_array(scales, names[1])]
                                 + ([numpy_helper.from_array(zp, names[2])] if zp is not None else []))
        written[w.name] = (names[0], scales, zu, nbits)
        del packed, zp
        attrs = dict(K=k, N=n, bits=nbits, block_size=spec.block_for(nbits))
        if spec.accuracy_level:
            attrs["accuracy_level"] = spec.accuracy_level
        nodes.append(helper.make_node("MatMulNBits", [node.input[0]] + names, [node.output[0]],
                                      name=f"{node.name}_Q{nbits}" if node.name else "", domain="com.microsoft",
                                      **attrs))
    del graph.node[:]
    graph.node.extend(nodes)
    if not any(o.domain == "com.microsoft" for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    return written


def quantize_embedding(model, store: LazyWeights, spec: QuantSpec, shared: Optional[tuple], bits: int,
                       importance=None) -> dict:
    """The embedding Gather (of the input ids) rewritten into onnxruntime's GatherBlockQuantized over a quantized table: the
    tied LM head's MatMulNBits codes when `shared` (quantize_matmuls' entry for it: the same (V, h) table in blocks
    along h, one initializer read by both nodes), else the table quantized here by the spec's recipe in `bits`. The
    gathered (.., n_blocks, block) rows are reshaped to (.., h). Returns export_info's "embedding" entry."""
    from onnx import TensorProto, helper, numpy_helper

    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    gather = _embedding_gather(graph)  # found now: the rewrites before rebuilt the node list (new messages)
    table = inits[gather.input[0]]
    v, h = (int(d) for d in table.dims)
    if shared is not None:
        codes_name, scales, zeros, bits = shared
    block = spec.block_for(bits)
    nb = -(-h // block)
    if shared is None:
        weight = store.array(table)  # (V, h)
        packed, scales, _, zeros = _fit(weight.T, spec, bits, None)  # blocks along h: the table's rows
        del weight
        codes_name = f"{table.name}_Q{bits}"
        graph.initializer.append(numpy_helper.from_array(packed, codes_name))
        del packed
    store.release(table.name)
    base = f"{table.name}.gbq"
    ins = [codes_name, gather.input[1], base + ".scales"]
    extra = [numpy_helper.from_array(np.ascontiguousarray(scales.reshape(v, nb, 1)), base + ".scales")]
    if zeros is not None:  # one zero point a byte here (GatherBlockQuantized wants the data's rank and layout)
        ins.append(base + ".zp")
        extra.append(numpy_helper.from_array(np.ascontiguousarray(zeros.reshape(v, nb, 1).astype(np.uint8)),
                                             base + ".zp"))
    shape = helper.make_tensor(base + ".shape", TensorProto.INT64, [3], [0, 0, nb * block])
    graph.initializer.extend(extra + [shape])
    out = gather.output[0]
    made = [helper.make_node("GatherBlockQuantized", ins, [base + ".rows"], domain="com.microsoft", gather_axis=0,
                             quantize_axis=2, block_size=block, bits=bits, name=base),  # (B, S, n_blocks, block)
            helper.make_node("Reshape", [base + ".rows", shape.name], [out if nb * block == h else base + ".flat"],
                             name=base + ".reshape")]  # (B, S, n_blocks * block)
    if nb * block != h:  # the last block's padding dropped: (B, S, h)
        graph.initializer.extend([helper.make_tensor(base + ".start", TensorProto.INT64, [1], [0]),
                                  helper.make_tensor(base + ".end", TensorProto.INT64, [1], [h]),
                                  helper.make_tensor(base + ".axis", TensorProto.INT64, [1], [2])])
        made.append(helper.make_node("Slice", [base + ".flat", base + ".start", base + ".end", base + ".axis"], [out],
                                     name=base + ".slice"))
    nodes = []
    for n in graph.node:
        nodes.extend(made if n.op_type == "Gather" and list(n.output) == [out] else [n])
    del graph.node[:]
    graph.node.extend(nodes)
    return dict(bits=bits, block_size=block, shared_with_lm_head=shared is not None, op="GatherBlockQuantized")


def _name_node(node, name: str) -> str:
    node.name = name
    return name
