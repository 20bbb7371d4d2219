"""A servable checkpoint -> ONNX decoder with KV cache (via jit.save + paddle2onnx), self-validated.

Which checkpoints are servable, and how each layer is laid out, the family registry says (paddle_vha/families.py):
stock Qwen3 (e.g. a folded Qwen3-VHA) and Qwen3-MEA 'before_hlc'; a Qwen3-VHA checkpoint is refused ("fold it first").
The export asks once, at its start: the serving plan (paddle_vha/export/plan.py) holds the answers and is passed to the
decoder, the graph clean-up, the validation and the onnxruntime-genai files.

The stages, each holding at most one float32 copy of the weights (so the export fits in about twice the weights,
paddle_vha/export/memory.py, refused up front where the machine has less):
    1. the decoder (paddle_vha/export/decoder.py) built tensor by tensor from the checkpoint and saved as the static
       Paddle program (paddle/), then freed;
    2. paddle2onnx converts that program with stand-in weights, and the real ones are copied into the graph from the
       program's parameter file, inline or as external data (paddle_vha/export/paddle_program.py, weights.py): one
       path at any size, with no protobuf message over 2 GB;
    3. the validation: the PaddleFormers reference, then onnxruntime (paddle_vha/export/validation.py).

Output folder:
    model.onnx (+ model.onnx.data when over 2 GB)   the decoder, standard ONNX ops only
    paddle/model.json, paddle/model.pdiparams         the same static program, for Paddle Inference
    export_info.json                                  I/O names, shapes and the validation numbers
    config.json (+ tokenizer / generation files)      copied from the checkpoint
    genai_config.json (+ a byte-level tokenizer)      for onnxruntime-genai (paddle_vha/export/genai.py)
"""
from __future__ import annotations

import dataclasses
import gc
import json
import os
import shutil
import time

from ..checkpoint.contract import CheckpointError, file_problem
from ..checkpoint.folder import CheckpointFolder
from ..checkpoint.fsutil import atomic_dir, check_output_dir
from .decoder import KVDecoder
from .errors import ExportError
from .genai import write_genai_files
from .kv_cache import GENAI_REFUSAL, INT8_NAMES, check_kv_cache, kv_cache_refusal, quantize_cache
from .graph import finalize_graph
from .memory import check_memory
from .paddle_program import convert_without_weights, run_paddle2onnx, save_program
from .plan import CACHE_IO, ServingPlan, serving_plan
from .quality import (BOUNDS, bounds_note, check_quality, gate_text, held_out_windows, measure_quality,
                      quality_tokens, teacher_forced_logits)
from .quantize import QuantSpec, check_weights, default_spec, quantize_graph
from .reference import CheckpointTensors, reference_model, weight_bytes  # noqa: F401 - reference_model re-exported
from .validation import Validation, validate_onnx
from .weights import DATA_FILE, attach_weights, needs_external_data

__all__ = ["export_onnx", "ExportError", "validate_onnx", "reference_model", "COPY_FILES"]

# what a runtime needs beside the graph: the config, the tokenizer in each format a checkpoint may carry, the chat
# template (transformers >= 4.43 writes it as its own file), the generation defaults
COPY_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "vocab.json",
              "merges.txt", "special_tokens_map.json", "added_tokens.json", "chat_template.jinja",
              "chat_template.json", "tokenizer.model")
OPSETS = range(14, 22)  # Qwen3's causal mask needs Trilu (14); paddle2onnx 2.1.0 converts up to 21
# --kv-cache's quality gate: 2 held-out windows of KV_GATE_POSITIONS tokens, prefilled KV_GATE_CHUNK at a time through
# the cache, the last KV_GATE_STEPS one decode step each (paddle_vha/export/kv_quality.py)
KV_GATE_POSITIONS, KV_GATE_CHUNK, KV_GATE_STEPS = 320, 64, 32
_run_paddle2onnx = run_paddle2onnx  # the converter's child process (tests/test_export_bad_input.py)


def _check_options(opset: int, cache_io: str) -> None:
    if opset < OPSETS[0]:
        raise ExportError(f"opset {opset} < 14: Qwen3's causal mask needs Trilu-era ops (opset >= 14)")
    if opset > OPSETS[-1]:
        raise ExportError(f"opset {opset}: paddle2onnx 2.1.0 converts to opsets {OPSETS[0]}..{OPSETS[-1]}")
    if cache_io not in CACHE_IO:
        raise ExportError(f"cache {cache_io!r}: expected one of {', '.join(CACHE_IO)}")


def export_onnx(ckpt_dir, out_dir, opset=17, decode_steps=16, tolerance=1e-4, force=False, log=print,
                external_data=None, cache_io="concat", weights="fp32", block_size=None, quantize_lm_head=True,
                quality_bounds=None, kv_cache="fp32", kv_quality_bounds=None, calibration_text=None,
                paddle_program=None, attention_op="stock"):
    """Export the servable checkpoint `ckpt_dir` (a path or an opened CheckpointFolder) and validate it; writes out_dir
    atomically (a temp folder renamed at the end). Refused up front (ExportError, nothing read or written) when the
    machine's available memory is below the export's need (paddle_vha/export/memory.py).

    external_data: store weights in model.onnx.data (None or False: only when the graph would pass protobuf's 2 GB
    limit with them inline, paddle_vha/export/weights.py).
    cache_io: "concat" (the onnxruntime-genai / Optimum interface: present = past + new) or "buffer" (the in-place
    flavour paddle_vha.serve runs: the runtime's cache buffers in, the new positions out; paddle_vha/export/decoder.py).
    weights: "fp32", or "int8" / "int4" (the format's default recipe, paddle_vha/export/quantize.py default_spec, in
    blocks of `block_size` when given), or a QuantSpec: the float32 graph is exported and validated first, then
    quantized, and its logits on the held-out part of `calibration_text` (a file; the embedded prose + code text by
    default) must stay within `quality_bounds` of the float32 graph's (paddle_vha/export/quality.py).
    paddle_program: keep the static float32 Paddle program (paddle/, for Paddle Inference) in OUT_DIR; default: with
    float32 weights only (a quantized folder holds what its onnxruntime deployment needs).
    kv_cache: "fp32", or "int8" (paddle_vha/export/kv_cache.py: the graph's attention rewritten to read an int8 cache
    with per-token scales, after the weights' quantization; its logits over held-out text at a longer context must
    stay within `kv_quality_bounds` of the float32 cache's, paddle_vha/export/kv_quality.py).
    attention_op: "stock", or "fused" (paddle_vha/export/fused_attention.py: each layer's attention over the cache
    as one node of paddle-vha's onnxruntime op library; the graph's logits checked against the stock graph's).
    """
    from .fused_attention import attention_op_refusal, check_attention_op

    check_attention_op(attention_op)
    if attention_op == "fused" and attention_op_refusal(cache_io):
        raise ExportError(attention_op_refusal(cache_io))
    spec = _resolve_options(opset, cache_io, weights, block_size, quantize_lm_head, kv_cache)
    weights = spec.weights if spec else "fp32"
    t0 = time.time()
    plan = _checked_plan(ckpt_dir, out_dir, force, cache_io, weights, kv_cache, log)
    tensors = CheckpointTensors(plan.folder)  # each tensor read when the decoder / the reference model takes it
    with atomic_dir(out_dir, tool="export_onnx", replace=force, error=ExportError) as tmp:
        onnx_path, param_bytes, external, sources = _write_graphs(plan, tensors, tmp, opset, external_data)
        log(f"exported {onnx_path.replace(tmp, out_dir)} (opset {opset}, {param_bytes / 1e6:.1f} MB of weights"
            f"{', external data in ' + DATA_FILE if external else ''}) in {time.time() - t0:.1f} s")
        val = _validate_float(onnx_path, plan, tensors, decode_steps, tolerance, log)
        quant = kv = None
        if weights != "fp32":
            quant = _quantize(onnx_path, plan, spec, external_data, quality_bounds, log, sources, calibration_text)
            external = quant["external_data"]
        fused = None
        if kv_cache != "fp32":
            kv = _quantize_cache(onnx_path, plan, kv_cache, kv_quality_bounds, log, attention_op)
            plan = dataclasses.replace(plan, cache_names=[INT8_NAMES] * plan.num_layers, genai_refusal=GENAI_REFUSAL)
            if attention_op == "fused":
                from .fused_attention import info as fused_info

                fused = fused_info("int8")
        elif attention_op == "fused":
            fused = _fuse_float(onnx_path, plan, log)
        _side_files(tmp, plan, keep_program=(weights == "fp32") if paddle_program is None else bool(paddle_program),
                    log=log)
        if fused is not None:
            from .fused_attention import ship_library

            fused = ship_library(tmp, fused, log)
        _write_export_info(tmp, plan, opset, val, tolerance, external, sources, quant, kv, fused)
    return val


def _resolve_options(opset, cache_io, weights, block_size, quantize_lm_head, kv_cache):
    """The options checked (ExportError, before anything is read); the QuantSpec of `weights` (None for fp32)."""
    _check_options(opset, cache_io)
    check_kv_cache(kv_cache)
    if isinstance(weights, QuantSpec):
        check_weights(weights.weights, weights.block_size)
        return weights
    check_weights(weights, block_size)
    return default_spec(weights, block_size, quantize_lm_head=quantize_lm_head) if weights != "fp32" else None


def _checked_plan(ckpt_dir, out_dir, force, cache_io, weights, kv_cache, log) -> ServingPlan:
    """The serving plan of the checkpoint, after every refusal that needs no tensor: OUT, the flavour for sliding
    windows, the cache type for the model, the side files, the quality check's windows, the machine's memory."""
    ckpt_path = ckpt_dir.path if isinstance(ckpt_dir, CheckpointFolder) else ckpt_dir
    check_output_dir(out_dir, [ckpt_path], force, ExportError, input_label="the checkpoint")
    plan = serving_plan(ckpt_dir, cache_io)  # the folder opened, the registry asked: once, here
    cfg = plan.config
    if cache_io == "buffer" and any(plan.cache_windows):
        raise ExportError(f"{plan.folder.path}: the buffer flavour (--cache buffer) is not offered for sliding-window "
                          "layers (their cache keeps only the window); export with the default --cache concat")
    if kv_cache != "fp32" and kv_cache_refusal(plan):
        raise ExportError(f"{plan.folder.path}: {kv_cache_refusal(plan)}")
    _check_side_files(plan.folder.path)
    if weights != "fp32":  # the quality check's windows fit the model's positions; none left is refused now
        quality_tokens(int(plan.rope.context))
    float_bytes = weight_bytes(plan.folder)
    need = check_memory(float_bytes, plan.folder.path, weight_bytes(plan.folder, largest=True), weights != "fp32")
    log(f"loaded {plan.folder.path}: {cfg.num_hidden_layers} layers, {cfg.num_attention_heads} query heads, "
        f"{cfg.num_key_value_heads} KV heads, head_dim {cfg.head_dim}; {float_bytes / 1e9:.2f} GB of float32 weights, "
        f"the export needs about {need / 1e9:.1f} GB of memory")
    return plan


def _validate_float(onnx_path, plan, tensors, decode_steps, tolerance, log) -> Validation:
    """The float32 graph against the Paddle model (prefill + greedy decode); ExportError outside `tolerance`."""
    val = validate_onnx(onnx_path, plan, tensors, decode_steps=decode_steps, log=log)
    if not val.max_abs <= val.bound(tolerance):
        raise ExportError(f"validation failed: onnxruntime vs Paddle max abs logit diff {val.max_abs:.2e} > "
                          f"{val.bound(tolerance):.2e} ({tolerance:.0e} x max |logit| {val.logit_scale:.3g})")
    if not val.tokens_match:
        raise ExportError("validation failed: greedy tokens differ between onnxruntime and Paddle")
    return val


def _side_files(tmp: str, plan: ServingPlan, keep_program: bool, log) -> None:
    """What ships beside the graph: the checkpoint's tokenizer / config files, onnxruntime-genai's, and the Paddle
    program only when kept (the float32 program is 4-8x a quantized graph's bytes)."""
    if not keep_program:
        shutil.rmtree(os.path.join(tmp, "paddle"))
    for name in COPY_FILES:
        src = os.path.join(plan.folder.path, name)
        if os.path.isfile(src):
            shutil.copy2(src, os.path.join(tmp, name))
    write_genai_files(tmp, plan, log=log)


def _fuse_float(onnx_path, plan, log) -> dict:
    """The float32-cache graph at onnx_path rewritten with the fused attention op (paddle_vha/export/
    fused_attention.py); its logits over held-out text through the cache (prefill, chunks, single steps) checked
    against the stock graph's: ExportError beyond float32 rounding (max |diff| / max |logit| > 1e-4)."""
    import numpy as np

    from ..serve.ort_session import OrtDecoder
    from .fused_attention import fuse_float
    from .kv_quality import cached_logits

    t0 = time.time()
    ids, _ = held_out_windows(plan.folder.path, int(plan.config.vocab_size), batch=2,
                              seq_len=min(512, int(plan.rope.context)))

    def blocks(custom_ops):
        s = OrtDecoder(onnx_path, custom_ops=custom_ops)
        s.cache_windows, s.cache_io = [None] * len(s.cache_slots), plan.cache_io
        out = [np.asarray(b, np.float32) for _, b in cached_logits(s, ids, 64, 8)]
        del s
        gc.collect()
        return out

    before = blocks(False)
    info = fuse_float(onnx_path, plan)
    after = blocks(True)
    worst = max(float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30)) for a, b in zip(after, before))
    log(f"attention: fused (DecodeAttention, ai.paddle_vha) in every layer; logits against the stock graph's over "
        f"{ids.size:,} held-out tokens: max |diff| / max |logit| {worst:.1e}, in {time.time() - t0:.1f} s")
    if not worst <= 1e-4:
        raise ExportError(f"--attention-op fused: the fused graph's logits differ from the stock graph's by "
                          f"{worst:.1e} of their scale (more than float32 rounding, 1e-4)")
    return dict(info, max_relative_logit_difference=worst)


def _quantize_cache(onnx_path, plan, kv_cache, bounds, log, attention_op="stock") -> dict:
    """The validated graph at onnx_path rewritten in place to the `kv_cache` cache (paddle_vha/export/kv_cache.py),
    its logits on held-out text at a longer context checked against the graph's before (ExportError outside the
    bounds, paddle_vha/export/kv_quality.py); returns export_info's "kv_cache" entry."""
    from ..serve.ort_session import OrtDecoder
    from .kv_quality import CACHE_BOUNDS, cached_logits, check_cache_quality, compare_blocks, quality_line

    t0 = time.time()
    chunk, steps = KV_GATE_CHUNK, KV_GATE_STEPS
    ids, text = held_out_windows(plan.folder.path, int(plan.config.vocab_size), batch=2,
                                 seq_len=min(KV_GATE_POSITIONS, int(plan.rope.context)))

    def session(custom_ops=False):
        s = OrtDecoder(onnx_path, custom_ops=custom_ops)
        s.cache_windows, s.cache_io = [None] * len(s.cache_slots), plan.cache_io
        return s

    sess = session()
    reference = [(start, block) for start, block in cached_logits(sess, ids, chunk, steps)]  # the float32 cache's
    del sess
    gc.collect()
    info = quantize_cache(onnx_path, plan, **({"attention_op": attention_op} if attention_op != "stock" else {}))
    log(f"KV cache: {kv_cache}, per token and KV head scales ({info['bytes_per_position']:,} bytes a position over all "
        f"layers, float32: {info['float32_bytes_per_position']:,}), read by "
        f"{'DecodeAttentionInt8 (fused)' if attention_op == 'fused' else 'MatMulIntegerToFloat'}, in "
        f"{time.time() - t0:.1f} s")
    sess = session(custom_ops=attention_op == "fused")
    quality = compare_blocks(reference, sess, ids, chunk, steps, text + f" (prefill {chunk}, then chunks of {chunk} "
                             f"through the cache, the last {steps} one step each)")
    del sess, reference
    gc.collect()
    note = bounds_note(kv_cache, bounds, CACHE_BOUNDS, "cache gate")
    log(quality_line(quality, kv_cache, bounds) + (f"; {note}" if note else ""))
    check_cache_quality(quality, kv_cache, bounds)
    return dict(info, quality=quality.as_dict(), bounds=list(bounds or CACHE_BOUNDS[kv_cache]), bounds_set_by_user=note)


def _quantize(onnx_path, plan, spec, external_data, bounds, log, sources=None, calibration_text=None) -> dict:
    """The validated float32 graph at onnx_path quantized in place by `spec` (a QuantSpec), calibrated on the
    calibration part of the text (activation statistics, for an activation-aware recipe), and its quality on the
    text's held-out part checked against the float32 graph's (ExportError outside the bounds); returns export_info's
    "weights" entry."""
    from ..serve.ort_session import OrtDecoder
    from .blockquant import RECIPES
    from .calibration import text_importance

    t0 = time.time()
    context = int(plan.rope.context)
    seq = quality_tokens(context)
    text = gate_text(plan.folder.path, int(plan.config.vocab_size), calibration_text, min_tokens=seq + 2)
    ids, words = held_out_windows(plan.folder.path, int(plan.config.vocab_size), seq_len=seq, text=text)

    def session():
        s = OrtDecoder(onnx_path)
        s.cache_windows, s.cache_io = plan.input_windows, plan.cache_io
        return s

    sess = session()
    reference = teacher_forced_logits(sess, ids)  # the float32 graph's, then freed
    del sess
    gc.collect()
    importance = None
    if spec.recipe != "rtn" and RECIPES[spec.recipe].weighted:
        importance = text_importance(onnx_path, text, context, plan.input_windows, plan.cache_io)
        log(f"calibration: activation statistics of {len(importance)} MatMul inputs on {text.source} in "
            f"{time.time() - t0:.1f} s")
    info = quantize_graph(onnx_path, spec, external_data=bool(external_data), max_positions=context,
                          sources=sources, importance=importance, num_layers=plan.num_layers)
    by_bits = ", ".join(f"{v} in {k} bits" for k, v in sorted(info["quantized_matmuls_by_bits"].items()))
    log(f"quantized: {spec.describe()} (onnxruntime MatMulNBits: {by_bits}; embedding {_embedding_words(info)}): "
        f"{info['weight_bytes'] / 1e6:.1f} MB of weights in the graph, in {time.time() - t0:.1f} s")
    sess = session()
    quality = measure_quality(reference, sess, ids, words)
    del sess, reference
    gc.collect()
    log(quality.line(spec.weights, bounds))
    check_quality(quality, spec.weights, bounds)
    return dict(info, quality=quality.as_dict(), bounds=list(bounds or BOUNDS[spec.weights]),
                bounds_set_by_user=bounds_note(spec.weights, bounds), calibration_text=text.source)


def _embedding_words(info: dict) -> str:
    emb = info.get("embedding")
    if not isinstance(emb, dict):
        return "float32"
    return f"{emb['bits']} bits" + (", one table with the LM head" if emb["shared_with_lm_head"] else "")


def _check_side_files(folder: str) -> None:
    """The files the export copies (COPY_FILES), where present, are regular files: a FIFO, a device, a folder or a link
    that cannot be followed is refused (CheckpointError, one line) before any work, not skipped at the end."""
    for name in COPY_FILES[1:]:  # config.json was read already
        path = os.path.join(folder, name)
        if os.path.lexists(path) and file_problem(path):
            raise CheckpointError(f"{path}: {file_problem(path)}; refusing to copy it")


def _save_decoder(plan: ServingPlan, tensors, prefix: str) -> dict:
    """The decoder built from the checkpoint, saved as the static Paddle program PREFIX.json + PREFIX.pdiparams, and
    freed (the next stages read the weights from PREFIX.pdiparams); returns {parameter name: checkpoint tensor}."""
    import paddle

    paddle.set_default_dtype("float32")
    decoder = KVDecoder(plan, tensors)
    decoder.eval()
    save_program(decoder, plan, prefix)
    sources = dict(decoder.weight_sources)
    del decoder
    gc.collect()
    return sources


def _write_graphs(plan: ServingPlan, tensors, tmp: str, opset: int, external_data):
    """The static Paddle program (tmp/paddle/) and the cleaned-up ONNX graph (tmp/model.onnx, its weights inline or
    in model.onnx.data); returns (the ONNX path, the weights' bytes, whether they are external data, {initializer name:
    the checkpoint tensor it holds})."""
    import onnx

    prefix = os.path.join(tmp, "paddle", "model")
    sources = _save_decoder(plan, tensors, prefix)
    raw_onnx = os.path.join(tmp, "raw.onnx")
    entries = convert_without_weights(prefix, raw_onnx, opset)
    model = finalize_graph(onnx.load(raw_onnx), plan, {e.name for e in entries})
    os.remove(raw_onnx)
    read = {t.name for t in model.graph.initializer}
    sources = {name: src for name, src in sources.items() if name in read}
    param_bytes = sum(e.nbytes for e in entries if e.name in read)
    external = bool(external_data) or needs_external_data(param_bytes, model.ByteSize())
    attach_weights(model, entries, prefix + ".pdiparams", tmp, external)
    onnx_path = os.path.join(tmp, "model.onnx")
    with open(onnx_path, "wb") as f:  # the message itself: small with external data, under 2 GB inline
        f.write(model.SerializeToString())
    del model
    gc.collect()
    return onnx_path, param_bytes, external, sources


def _write_export_info(tmp: str, plan: ServingPlan, opset: int, val: Validation, tolerance: float,
                       external: bool, sources: dict, quant: dict = None, kv: dict = None,
                       fused: dict = None) -> None:
    """export_info.json: the graph's I/O names and cache layout (what paddle_vha.serve reads), the validation."""
    cfg = plan.config
    ins, outs = plan.io_names
    ops = quant.pop("ops") if quant else val.ops
    if kv or fused:  # the rewrite added its ops
        ops = _graph_ops(os.path.join(tmp, "model.onnx"))
    info = dict(format="paddle-vha onnx decoder v1", opset=opset, inputs=ins, outputs=outs,
                num_hidden_layers=cfg.num_hidden_layers, num_attention_heads=cfg.num_attention_heads,
                num_key_value_heads=cfg.num_key_value_heads, head_dim=cfg.head_dim, vocab_size=cfg.vocab_size,
                max_position_embeddings=cfg.max_position_embeddings, context_length=plan.rope.context,
                rope=dict(rope_type=plan.rope.rope_type, factor=plan.rope.factor,
                          attention_scaling=plan.rope.attention_scaling),
                kv_layout=("[batch, num_key_value_heads, past_sequence, head_dim]" if not kv else
                           "int8 cache: kv_cache.layout"), dtype="float32",
                model_type=cfg.model_type, cache_shapes=[list(x) for x in plan.cache_shapes],
                cache_names=[list(x) for x in plan.cache_names], cache_windows=plan.cache_windows,
                cache_io=plan.cache_io, external_data=DATA_FILE if external else None,
                validation=dict(prefill_max_abs=val.prefill_max_abs, decode_max_abs=val.decode_max_abs,
                                decode_steps=val.steps, tolerance=tolerance, logit_scale=val.logit_scale,
                                bound=val.bound(tolerance)),
                ops=ops, weights=quant or dict(format="fp32"), kv_cache=kv or dict(format="fp32"),
                weight_sources=sources, paddle_program="paddle/" if os.path.isdir(os.path.join(tmp, "paddle")) else None,
                attention_op=fused or dict(op="stock"))
    with open(os.path.join(tmp, "export_info.json"), "w") as f:
        json.dump(info, f, indent=2)


def _graph_ops(onnx_path: str) -> list:
    import onnx

    return sorted({n.op_type for n in onnx.load(onnx_path, load_external_data=False).graph.node})
