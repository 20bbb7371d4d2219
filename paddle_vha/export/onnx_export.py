"""A servable checkpoint -> ONNX decoder with KV cache (via jit.save + paddle2onnx), self-validated.

Which checkpoints are servable, and how each layer is laid out, the family registry says (paddle_vha/families.py):
stock Qwen3 (e.g. a folded Qwen3-VHA) and Qwen3-MEA 'before_hlc'; a Qwen3-VHA checkpoint is refused ("fold it first").

Output folder:
    model.onnx (+ model.onnx.data when over 2 GB)   the decoder, standard ONNX ops only
    paddle/model.json, paddle/model.pdiparams         the same static program, for Paddle Inference
    export_info.json                                  I/O names, shapes and the validation numbers
    config.json (+ tokenizer / generation files)      copied from the checkpoint
    genai_config.json (+ a byte-level tokenizer)      for onnxruntime-genai (paddle_vha/export/genai.py)
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field

import numpy as np

from ..checkpoint.contract import CheckpointError
from ..checkpoint.folder import CheckpointFolder
from ..checkpoint.fsutil import atomic_dir, check_output_dir
from ..checkpoint.load import load_tensors_into
from ..families import family_of
from .decoder import CACHE_IO, Qwen3KVDecoder, cache_inputs, cache_names, cache_shapes, cache_windows, graph_io_names
from .genai import write_genai_files

__all__ = ["export_onnx", "ExportError", "validate_onnx", "load_servable", "reference_model"]

COPY_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "vocab.json",
              "merges.txt", "special_tokens_map.json", "added_tokens.json")
STANDARD_DOMAINS = ("", "ai.onnx")
OPSETS = range(14, 22)  # Qwen3's causal mask needs Trilu (14); paddle2onnx 2.1.0 converts up to 21
TWO_GB = 2 * 1024**3


class ExportError(RuntimeError):
    """The export failed or did not validate; one line says why."""


@dataclass
class Validation:
    prefill_max_abs: float = 0.0
    decode_max_abs: float = 0.0
    steps: int = 0
    tokens_match: bool = True
    ops: list = field(default_factory=list)

    @property
    def max_abs(self):
        return max(self.prefill_max_abs, self.decode_max_abs)


def _run_paddle2onnx(model_json: str, params: str, out: str, opset: int, external_file: str) -> None:
    """paddle2onnx in a child process: its C++ code aborts the whole process on some inputs (an unsupported opset
    exits 134 with no message), and prints progress lines we do not want on the terminal. Its own words reach the
    user when it fails."""
    code = ("import sys, paddle2onnx; paddle2onnx.export(sys.argv[1], sys.argv[2], sys.argv[3], "
            "opset_version=int(sys.argv[4]), auto_upgrade_opset=False, optimize_tool='None', external_file=sys.argv[5])")
    r = subprocess.run([sys.executable, "-c", code, model_json, params, out, str(opset), external_file],
                       capture_output=True, text=True, errors="replace")
    said = [ln.strip() for ln in (r.stdout + "\n" + r.stderr).splitlines() if ln.strip()]
    if r.returncode != 0 or not os.path.isfile(out):
        how = f"exit code {r.returncode}" if r.returncode >= 0 else f"killed by signal {-r.returncode}"
        last = said[-1] if said else "no output"
        raise ExportError(f"paddle2onnx failed ({how}): {last[:400]}")


def load_servable(src):
    """(config, {name: float32 array}) of a checkpoint the export can serve as it is (path or CheckpointFolder),
    validated against its family's contract; CheckpointError (one line) otherwise."""
    ck = CheckpointFolder.open(src)
    fam = family_of(ck)
    if not fam.servable:  # refused before its config is even parsed: nothing of it is served
        raise CheckpointError(f"{ck.path}: is a {fam.label} checkpoint; {fam.not_exported}")
    cfg = fam.load_config(ck)
    why = fam.export_refusal(cfg)
    if why:
        raise CheckpointError(f"{ck.path}: {why}")
    fam.check_tensors(ck, cfg)
    tensors = ck.read_all(float32=True)
    for name, a in tensors.items():  # a NaN would pass the export's own checks unnoticed (it compares two NaN models)
        bad = int(np.size(a) - np.isfinite(a).sum())
        if bad:
            raise CheckpointError(f"{ck.path}: {name} holds {bad} non-finite value(s) (NaN or Inf); refusing to export")
    return cfg, tensors


def reference_model(cfg, tensors: dict):
    """The family's PaddleFormers causal LM holding `tensors` (disk layout -> Paddle's [in, out] Linears), eval mode."""
    model = family_of(cfg).model_class(cfg)
    load_tensors_into(model, tensors, source="reference model")
    model.eval()
    return model


def _static_program(decoder, cfg, dest_prefix):
    import paddle
    from paddle.static import InputSpec

    ins, _ = graph_io_names(cfg, decoder.cache_io)
    shapes = cache_inputs(cfg)
    kv = [InputSpec([None, h, None, w], "float32", n) for n, (h, w) in zip(ins[3:], shapes)]
    specs = [InputSpec([None, None], "int64", n) for n in ins[:3]] + [kv]
    static = paddle.jit.to_static(decoder, input_spec=specs, full_graph=True)
    paddle.jit.save(static, dest_prefix, input_spec=specs)


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


def _finalize_graph(model, cfg, cache_io="concat"):
    """Name outputs as the KV-cache convention says, drop Identity copies, name the dynamic axes."""
    ins, outs = graph_io_names(cfg, cache_io)
    graph = model.graph
    if len(graph.output) != len(outs):
        raise ExportError(f"paddle2onnx produced {len(graph.output)} outputs, expected {len(outs)}")
    rename = {}
    for out, name in zip(graph.output, outs):
        rename[out.name] = name
        out.name = name
    # Identity nodes that only copy a tensor to a graph output: let the producer write the output directly.
    keep = []
    for node in graph.node:
        if node.op_type == "Identity" and node.output[0] in rename:
            rename[node.input[0]] = rename[node.output[0]]  # producer now writes the output; readers follow
            continue
        keep.append(node)
    if any(n in rename for n in (i.name for i in graph.input)):
        raise ExportError("an output is a plain copy of an input; refusing to alias graph I/O")
    # paddle2onnx writes each weight as a Constant node followed by Identity copies: make the weights
    # initializers (so they can live in external data and ORT can pre-pack them) and drop the copies.
    nodes, alias = [], {}
    for node in keep:
        if node.op_type == "Constant" and len(node.attribute) == 1 and node.attribute[0].name == "value":
            tensor = node.attribute[0].t
            tensor.name = node.output[0]
            graph.initializer.append(tensor)
        elif node.op_type == "Identity":
            alias[node.output[0]] = node.input[0]
        else:
            nodes.append(node)
    del graph.node[:]
    graph.node.extend(nodes)

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
    _prune(graph)
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
    return model


def validate_onnx(onnx_path, cfg, tensors, decode_steps=16, batch=2, prompt_len=11, seed=0, log=print,
                  cache_io="concat") -> Validation:
    """onnx.checker full check, op whitelist, KV head count, and ORT vs Paddle logits (prefill + greedy decode)."""
    import onnx
    import paddle

    from ..serve.ort_session import OrtDecoder

    def finite(x, what):
        if not np.isfinite(x).all():
            raise ExportError(f"validation failed: {what} are not finite (NaN or Inf)")
        return x

    onnx.checker.check_model(onnx_path, full_check=True)
    model = onnx.load(onnx_path, load_external_data=False)
    bad = sorted({f"{n.domain}::{n.op_type}" for n in model.graph.node if n.domain not in STANDARD_DOMAINS})
    if bad:
        raise ExportError(f"non-standard ONNX ops in the graph: {', '.join(bad)}")
    ins, outs = graph_io_names(cfg, cache_io)
    if [i.name for i in model.graph.input] != ins or [o.name for o in model.graph.output] != outs:
        raise ExportError("graph inputs/outputs are not named by the KV-cache convention")
    want = cache_inputs(cfg)
    for vi, (h, w) in zip(model.graph.input[3:], want):
        dims = vi.type.tensor_type.shape.dim
        if (dims[1].dim_value, dims[3].dim_value) != (h, w):
            raise ExportError(f"{vi.name} is [.., {dims[1].dim_value}, .., {dims[3].dim_value}], expected {h} heads of width {w}")
    val = Validation(ops=sorted({n.op_type for n in model.graph.node}))

    ref = reference_model(cfg, tensors)
    sess = OrtDecoder(onnx_path)
    sess.cache_windows = [w for w, names in zip(cache_windows(cfg), cache_names(cfg)) for _ in names]
    sess.cache_io = cache_io
    rng = np.random.default_rng(seed)
    seq = rng.integers(0, cfg.vocab_size, size=(batch, prompt_len)).astype(np.int64)
    mask = np.ones(seq.shape, np.int64)  # the past length, which a sliding-window cache no longer shows
    logits, cache = sess.prefill(seq, mask)
    finite(logits, "onnxruntime's prefill logits")
    with paddle.no_grad():
        want = finite(ref(paddle.to_tensor(seq), return_dict=True).logits.numpy(), "Paddle's prefill logits")
    val.prefill_max_abs = float(np.abs(logits - want).max())
    for step in range(decode_steps):
        nxt = logits[:, -1].argmax(-1)[:, None].astype(np.int64)  # (B, 1)
        seq = np.concatenate([seq, nxt], axis=1)
        mask = np.ones(seq.shape, np.int64)
        logits, cache = sess.step(nxt, cache, mask)
        finite(logits, f"onnxruntime's logits at decode step {step + 1}")
        with paddle.no_grad():
            full = ref(paddle.to_tensor(seq), return_dict=True).logits.numpy()[:, -1:]
        finite(full, f"Paddle's logits at decode step {step + 1}")
        val.decode_max_abs = max(val.decode_max_abs, float(np.abs(logits - full).max()))
        val.tokens_match &= bool((logits[:, -1].argmax(-1) == full[:, -1].argmax(-1)).all())
        val.steps += 1
    windows = sorted({w for w in cache_windows(cfg) if w})
    crossing = ""
    if windows:
        crossing = (f"; the decode crosses the sliding window ({windows[0]})" if prompt_len + val.steps > windows[0]
                    else f"; the sliding window ({windows[0]}) is longer than the validation text")
    log(f"validation: onnxruntime vs Paddle logits, prefill {batch}x{prompt_len}: max abs diff "
        f"{val.prefill_max_abs:.2e}; {val.steps} greedy decode steps: max abs diff {val.decode_max_abs:.2e}; "
        f"greedy tokens {'match' if val.tokens_match else 'DIFFER'}{crossing}")
    return val


def export_onnx(ckpt_dir, out_dir, opset=17, decode_steps=16, tolerance=1e-4, force=False, log=print,
                external_data=None, cache_io="concat"):
    """Export the servable checkpoint `ckpt_dir` (a path or an opened CheckpointFolder) and validate it; writes out_dir
    atomically (a temp folder renamed at the end).

    external_data: store weights in model.onnx.data (None: only when they exceed protobuf's 2 GB limit).
    cache_io: "concat" (the onnxruntime-genai / Optimum interface: present = past + new) or "buffer" (the in-place
    flavour paddle_vha.serve runs: the runtime's cache buffers in, the new positions out; paddle_vha/export/decoder.py).
    """
    import onnx
    import paddle

    if opset < OPSETS[0]:
        raise ExportError(f"opset {opset} < 14: Qwen3's causal mask needs Trilu-era ops (opset >= 14)")
    if opset > OPSETS[-1]:
        raise ExportError(f"opset {opset}: paddle2onnx 2.1.0 converts to opsets {OPSETS[0]}..{OPSETS[-1]}")
    if cache_io not in CACHE_IO:
        raise ExportError(f"cache {cache_io!r}: expected one of {', '.join(CACHE_IO)}")
    ckpt_path = ckpt_dir.path if isinstance(ckpt_dir, CheckpointFolder) else ckpt_dir
    check_output_dir(out_dir, [ckpt_path], force, ExportError, input_label="the checkpoint")
    t0 = time.time()
    ck = CheckpointFolder.open(ckpt_dir)
    ckpt_dir = ck.path
    cfg, tensors = load_servable(ck)
    if cache_io == "buffer" and any(cache_windows(cfg)):
        raise ExportError(f"{ckpt_dir}: the buffer flavour (--cache buffer) is not offered for sliding-window layers "
                          "(their cache keeps only the window); export with the default --cache concat")
    log(f"loaded {ckpt_dir}: {cfg.num_hidden_layers} layers, {cfg.num_attention_heads} query heads, "
        f"{cfg.num_key_value_heads} KV heads, head_dim {cfg.head_dim}")
    with atomic_dir(out_dir, tool="export_onnx", replace=force, error=ExportError) as tmp:
        paddle.set_default_dtype("float32")
        decoder = Qwen3KVDecoder(cfg, tensors, cache_io=cache_io)
        decoder.eval()
        _static_program(decoder, cfg, os.path.join(tmp, "paddle", "model"))
        raw_onnx = os.path.join(tmp, "raw.onnx")
        param_bytes = sum(a.nbytes for a in tensors.values())
        too_big = param_bytes > TWO_GB * 0.9  # protobuf cannot hold it: paddle2onnx must write external data
        external = too_big if external_data is None else bool(external_data) or too_big
        _run_paddle2onnx(os.path.join(tmp, "paddle", "model.json"), os.path.join(tmp, "paddle", "model.pdiparams"),
                         raw_onnx, opset, os.path.join(tmp, "model.onnx.data") if too_big else "")
        model = _finalize_graph(onnx.load(raw_onnx, load_external_data=False), cfg, cache_io)
        onnx_path = os.path.join(tmp, "model.onnx")
        if external and not os.path.exists(os.path.join(tmp, "model.onnx.data")):
            # small enough for paddle2onnx to inline, but external data asked for: move the weights out
            onnx.save_model(model, onnx_path, save_as_external_data=True, all_tensors_to_one_file=True,
                            location="model.onnx.data", size_threshold=1024)  # small shape tensors stay inline
        else:  # inline weights, or already in model.onnx.data (paddle2onnx's > 2 GB path)
            onnx.save_model(model, onnx_path)
        os.remove(raw_onnx)
        log(f"exported {onnx_path.replace(tmp, out_dir)} (opset {opset}, {param_bytes / 1e6:.1f} MB of weights"
            f"{', external data' if external else ''}) in {time.time() - t0:.1f} s")
        val = validate_onnx(onnx_path, cfg, tensors, decode_steps=decode_steps, log=log, cache_io=cache_io)
        if not val.max_abs <= tolerance:
            raise ExportError(f"validation failed: onnxruntime vs Paddle max abs logit diff {val.max_abs:.2e} > {tolerance:.0e}")
        if not val.tokens_match:
            raise ExportError("validation failed: greedy tokens differ between onnxruntime and Paddle")
        for name in COPY_FILES:
            src = os.path.join(ckpt_dir, name)
            if os.path.isfile(src):
                shutil.copy2(src, os.path.join(tmp, name))
        write_genai_files(tmp, cfg, ck.config, cache_names(cfg), cache_shapes(cfg), cache_windows(cfg), log=log,
                          cache_io=cache_io)
        ins, outs = graph_io_names(cfg, cache_io)
        info = dict(format="paddle-vha onnx decoder v1", opset=opset, inputs=ins, outputs=outs,
                    num_hidden_layers=cfg.num_hidden_layers, num_attention_heads=cfg.num_attention_heads,
                    num_key_value_heads=cfg.num_key_value_heads, head_dim=cfg.head_dim, vocab_size=cfg.vocab_size,
                    max_position_embeddings=cfg.max_position_embeddings,
                    kv_layout="[batch, num_key_value_heads, past_sequence, head_dim]", dtype="float32",
                    model_type=cfg.model_type, cache_shapes=[list(x) for x in cache_shapes(cfg)],
                    cache_names=[list(x) for x in cache_names(cfg)], cache_windows=cache_windows(cfg), cache_io=cache_io,
                    validation=dict(prefill_max_abs=val.prefill_max_abs, decode_max_abs=val.decode_max_abs,
                                    decode_steps=val.steps, tolerance=tolerance), ops=val.ops)
        with open(os.path.join(tmp, "export_info.json"), "w") as f:
            json.dump(info, f, indent=2)
    return val
