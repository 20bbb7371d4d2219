"""A servable checkpoint -> ONNX decoder with KV cache (via jit.save + paddle2onnx), self-validated.

Which checkpoints are servable, and how each layer is laid out, the family registry says (paddle_vha/families.py):
stock Qwen3 (e.g. a folded Qwen3-VHA) and Qwen3-MEA 'before_hlc'; a Qwen3-VHA checkpoint is refused ("fold it first").
The export asks once, at its start: the serving plan (paddle_vha/export/plan.py) holds the answers and is passed to the
decoder, the graph clean-up, the validation and the onnxruntime-genai files.

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
from .decoder import Qwen3KVDecoder
from .genai import write_genai_files
from .plan import CACHE_IO, ServingPlan, serving_plan

__all__ = ["export_onnx", "ExportError", "validate_onnx", "load_servable", "servable_tensors", "reference_model"]

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


def load_servable(src, cache_io: str = "concat"):
    """(ServingPlan, {name: float32 array}) of a checkpoint the export can serve as it is (path or CheckpointFolder),
    validated against its family's contract; CheckpointError (one line) otherwise."""
    plan = serving_plan(src, cache_io)
    return plan, servable_tensors(plan)


def servable_tensors(plan: ServingPlan) -> dict:
    """{name: float32 array} of the plan's checkpoint; CheckpointError naming a tensor holding NaN or Inf."""
    tensors = plan.folder.read_all(float32=True)
    for name, a in tensors.items():  # a NaN would pass the export's own checks unnoticed (it compares two NaN models)
        bad = int(np.size(a) - np.isfinite(a).sum())
        if bad:
            raise CheckpointError(f"{plan.folder.path}: {name} holds {bad} non-finite value(s) (NaN or Inf); "
                                  "refusing to export")
    return tensors


def reference_model(plan: ServingPlan, tensors: dict):
    """The family's PaddleFormers causal LM holding `tensors` (disk layout -> Paddle's [in, out] Linears), eval mode."""
    model = plan.family.model_class(plan.config)
    load_tensors_into(model, tensors, source="reference model")
    model.eval()
    return model


def _static_program(decoder, plan: ServingPlan, dest_prefix):
    import paddle
    from paddle.static import InputSpec

    ins, _ = plan.io_names
    kv = [InputSpec([None, h, None, w], "float32", n) for n, (h, w) in zip(ins[3:], plan.cache_inputs)]
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


def _finalize_graph(model, plan: ServingPlan):
    """Name outputs as the KV-cache convention says, drop Identity copies, name the dynamic axes."""
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


def _check_graph(onnx_path: str, plan: ServingPlan) -> list:
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


def _finite(x, what):
    if not np.isfinite(x).all():
        raise ExportError(f"validation failed: {what} are not finite (NaN or Inf)")
    return x


def _compare_logits(sess, ref, val: Validation, seq, decode_steps: int) -> None:
    """onnxruntime (`sess`) vs Paddle (`ref`, the full sequence each step) logits for a prefill of `seq` and greedy
    decode steps; the differences and the token agreement go into `val`."""
    import paddle

    mask = np.ones(seq.shape, np.int64)  # the past length, which a sliding-window cache no longer shows
    logits, cache = sess.prefill(seq, mask)
    _finite(logits, "onnxruntime's prefill logits")
    with paddle.no_grad():
        want = _finite(ref(paddle.to_tensor(seq), return_dict=True).logits.numpy(), "Paddle's prefill logits")
    val.prefill_max_abs = float(np.abs(logits - want).max())
    for step in range(decode_steps):
        nxt = logits[:, -1].argmax(-1)[:, None].astype(np.int64)  # (B, 1)
        seq = np.concatenate([seq, nxt], axis=1)
        mask = np.ones(seq.shape, np.int64)
        logits, cache = sess.step(nxt, cache, mask)
        _finite(logits, f"onnxruntime's logits at decode step {step + 1}")
        with paddle.no_grad():
            full = ref(paddle.to_tensor(seq), return_dict=True).logits.numpy()[:, -1:]
        _finite(full, f"Paddle's logits at decode step {step + 1}")
        val.decode_max_abs = max(val.decode_max_abs, float(np.abs(logits - full).max()))
        val.tokens_match &= bool((logits[:, -1].argmax(-1) == full[:, -1].argmax(-1)).all())
        val.steps += 1


def validate_onnx(onnx_path, plan: ServingPlan, tensors, decode_steps=16, batch=2, prompt_len=11, seed=0,
                  log=print) -> Validation:
    """onnx.checker full check, op whitelist, KV head count, and ORT vs Paddle logits (prefill + greedy decode)."""
    from ..serve.ort_session import OrtDecoder

    val = Validation(ops=_check_graph(onnx_path, plan))
    ref = reference_model(plan, tensors)
    sess = OrtDecoder(onnx_path)
    sess.cache_windows = plan.input_windows
    sess.cache_io = plan.cache_io
    rng = np.random.default_rng(seed)
    seq = rng.integers(0, plan.config.vocab_size, size=(batch, prompt_len)).astype(np.int64)
    _compare_logits(sess, ref, val, seq, decode_steps)
    windows = sorted({w for w in plan.cache_windows if w})
    crossing = ""
    if windows:
        crossing = (f"; the decode crosses the sliding window ({windows[0]})" if prompt_len + val.steps > windows[0]
                    else f"; the sliding window ({windows[0]}) is longer than the validation text")
    log(f"validation: onnxruntime vs Paddle logits, prefill {batch}x{prompt_len}: max abs diff "
        f"{val.prefill_max_abs:.2e}; {val.steps} greedy decode steps: max abs diff {val.decode_max_abs:.2e}; "
        f"greedy tokens {'match' if val.tokens_match else 'DIFFER'}{crossing}")
    return val


def _check_options(opset: int, cache_io: str) -> None:
    if opset < OPSETS[0]:
        raise ExportError(f"opset {opset} < 14: Qwen3's causal mask needs Trilu-era ops (opset >= 14)")
    if opset > OPSETS[-1]:
        raise ExportError(f"opset {opset}: paddle2onnx 2.1.0 converts to opsets {OPSETS[0]}..{OPSETS[-1]}")
    if cache_io not in CACHE_IO:
        raise ExportError(f"cache {cache_io!r}: expected one of {', '.join(CACHE_IO)}")


def export_onnx(ckpt_dir, out_dir, opset=17, decode_steps=16, tolerance=1e-4, force=False, log=print,
                external_data=None, cache_io="concat"):
    """Export the servable checkpoint `ckpt_dir` (a path or an opened CheckpointFolder) and validate it; writes out_dir
    atomically (a temp folder renamed at the end).

    external_data: store weights in model.onnx.data (None: only when they exceed protobuf's 2 GB limit).
    cache_io: "concat" (the onnxruntime-genai / Optimum interface: present = past + new) or "buffer" (the in-place
    flavour paddle_vha.serve runs: the runtime's cache buffers in, the new positions out; paddle_vha/export/decoder.py).
    """
    _check_options(opset, cache_io)
    ckpt_path = ckpt_dir.path if isinstance(ckpt_dir, CheckpointFolder) else ckpt_dir
    check_output_dir(out_dir, [ckpt_path], force, ExportError, input_label="the checkpoint")
    t0 = time.time()
    plan, tensors = load_servable(ckpt_dir, cache_io)  # the folder opened, the registry asked: once, here
    cfg = plan.config
    if cache_io == "buffer" and any(plan.cache_windows):
        raise ExportError(f"{plan.folder.path}: the buffer flavour (--cache buffer) is not offered for sliding-window "
                          "layers (their cache keeps only the window); export with the default --cache concat")
    log(f"loaded {plan.folder.path}: {cfg.num_hidden_layers} layers, {cfg.num_attention_heads} query heads, "
        f"{cfg.num_key_value_heads} KV heads, head_dim {cfg.head_dim}")
    with atomic_dir(out_dir, tool="export_onnx", replace=force, error=ExportError) as tmp:
        onnx_path, param_bytes, external = _write_graphs(plan, tensors, tmp, opset, external_data)
        log(f"exported {onnx_path.replace(tmp, out_dir)} (opset {opset}, {param_bytes / 1e6:.1f} MB of weights"
            f"{', external data' if external else ''}) in {time.time() - t0:.1f} s")
        val = validate_onnx(onnx_path, plan, tensors, decode_steps=decode_steps, log=log)
        if not val.max_abs <= tolerance:
            raise ExportError(f"validation failed: onnxruntime vs Paddle max abs logit diff {val.max_abs:.2e} > "
                              f"{tolerance:.0e}")
        if not val.tokens_match:
            raise ExportError("validation failed: greedy tokens differ between onnxruntime and Paddle")
        for name in COPY_FILES:
            src = os.path.join(plan.folder.path, name)
            if os.path.isfile(src):
                shutil.copy2(src, os.path.join(tmp, name))
        write_genai_files(tmp, plan, log=log)
        _write_export_info(tmp, plan, opset, val, tolerance)
    return val


def _write_graphs(plan: ServingPlan, tensors: dict, tmp: str, opset: int, external_data):
    """The static Paddle program (tmp/paddle/) and the cleaned-up ONNX graph (tmp/model.onnx, its weights inline or
    in model.onnx.data); returns (the ONNX path, the weights' bytes, whether they are external data)."""
    import onnx
    import paddle

    paddle.set_default_dtype("float32")
    decoder = Qwen3KVDecoder(plan, tensors)
    decoder.eval()
    _static_program(decoder, plan, os.path.join(tmp, "paddle", "model"))
    raw_onnx = os.path.join(tmp, "raw.onnx")
    param_bytes = sum(a.nbytes for a in tensors.values())
    too_big = param_bytes > TWO_GB * 0.9  # protobuf cannot hold it: paddle2onnx must write external data
    external = too_big if external_data is None else bool(external_data) or too_big
    _run_paddle2onnx(os.path.join(tmp, "paddle", "model.json"), os.path.join(tmp, "paddle", "model.pdiparams"),
                     raw_onnx, opset, os.path.join(tmp, "model.onnx.data") if too_big else "")
    model = _finalize_graph(onnx.load(raw_onnx, load_external_data=False), plan)
    onnx_path = os.path.join(tmp, "model.onnx")
    if external and not os.path.exists(os.path.join(tmp, "model.onnx.data")):
        # small enough for paddle2onnx to inline, but external data asked for: move the weights out
        onnx.save_model(model, onnx_path, save_as_external_data=True, all_tensors_to_one_file=True,
                        location="model.onnx.data", size_threshold=1024)  # small shape tensors stay inline
    else:  # inline weights, or already in model.onnx.data (paddle2onnx's > 2 GB path)
        onnx.save_model(model, onnx_path)
    os.remove(raw_onnx)
    return onnx_path, param_bytes, external


def _write_export_info(tmp: str, plan: ServingPlan, opset: int, val: Validation, tolerance: float) -> None:
    """export_info.json: the graph's I/O names and cache layout (what paddle_vha.serve reads), the validation."""
    cfg = plan.config
    ins, outs = plan.io_names
    info = dict(format="paddle-vha onnx decoder v1", opset=opset, inputs=ins, outputs=outs,
                num_hidden_layers=cfg.num_hidden_layers, num_attention_heads=cfg.num_attention_heads,
                num_key_value_heads=cfg.num_key_value_heads, head_dim=cfg.head_dim, vocab_size=cfg.vocab_size,
                max_position_embeddings=cfg.max_position_embeddings,
                kv_layout="[batch, num_key_value_heads, past_sequence, head_dim]", dtype="float32",
                model_type=cfg.model_type, cache_shapes=[list(x) for x in plan.cache_shapes],
                cache_names=[list(x) for x in plan.cache_names], cache_windows=plan.cache_windows,
                cache_io=plan.cache_io,
                validation=dict(prefill_max_abs=val.prefill_max_abs, decode_max_abs=val.decode_max_abs,
                                decode_steps=val.steps, tolerance=tolerance), ops=val.ops)
    with open(os.path.join(tmp, "export_info.json"), "w") as f:
        json.dump(info, f, indent=2)
