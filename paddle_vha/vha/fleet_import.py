"""A VHA checkpoint written by PaddleFleet (upstream names, config and Paddle's [in, out] layout) -> this project's
Qwen3-VHA contract (docs/checkpoint.md), tensor by tensor (what tools/import_fleet.py runs).

Input tensor names, after an optional leading `model.`:
    embedding.embed_tokens.weight | embed_tokens.weight        -> model.embed_tokens.weight
    norm.weight, lm_head.weight                                -> model.norm.weight, lm_head.weight
    layers.{i}.<rest>                                          -> model.layers.{i}.<rest>, where in <rest>
        self_attn.qkv_proj.{weight,bias}   (fused)             -> q_proj, k_proj, v_proj: split by --qkv-layout,
                                                                  `grouped` [per KV group: its physical query heads |
                                                                  K | V] or `concat` [all Q | all K | all V]
        mlp.up_gate_proj.weight            (fused)             -> gate_proj, up_proj: halves in --up-gate-order
        every other name                                       -> the same name
Linear weights are transposed from Paddle's [in, out] to [out, in] (--layout paddle, the default; --layout hf
takes them as [out, in]). Premix [H_kv, r, d] and Postmix U, V [H_v, R] keep their layout: upstream's Premix einsum
`btgr,krd->btkgd` orders virtual heads group-major (k * H_p + g), as this project does, and its Postmix is
Y' = (I + V U^T) Y, as ours. Upstream's attention_bias puts no bias on o_proj, which Qwen3's attention_bias has: a
missing o_proj.bias is written as zeros (the same function). A tied lm_head equal to the embedding is dropped.

Everything is checked before anything is written (names, shapes, the translated config); OUT appears complete or
not at all.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np

from ..checkpoint import safetensors_io as st
from ..checkpoint.contract import CheckpointError, compare_shapes, few
from ..checkpoint.folder import CheckpointFolder, write_checkpoint_folder
from ..checkpoint.fsutil import atomic_dir, check_output_dir
from ..qwen3.contract import check_config_fields
from ..units import fmt_bytes
from .config import Qwen3VHAConfig, VHAConfigError
from .spec import tensor_shapes
from .fleet_config import QKV_LAYOUTS, UP_GATE_ORDERS, UPSTREAM_KEYS

__all__ = ["FleetImportError", "ImportPlan", "plan_import", "format_plan", "import_checkpoint", "QKV_LAYOUTS",
           "UP_GATE_ORDERS"]

_LAYER = re.compile(r"^layers\.(\d+)\.(.+)$")
_LINEAR = re.compile(r"(_proj)\.weight$")


class FleetImportError(CheckpointError):
    """An input import_fleet refuses; the message is one line naming the problem."""


@dataclass
class Entry:
    """One output tensor: made from `source` by `how` ('copy', 'transpose', 'split', 'zeros')."""

    name: str
    source: Optional[str]
    how: str
    shape: Tuple[int, ...]
    code: str
    part: Optional[Tuple[int, int, int]] = None  # split: (axis, index of the part, how many) of a fused tensor
    rows: Optional[np.ndarray] = None  # split: the output-feature indices of this part

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * st.DTYPES[self.code].itemsize


@dataclass
class ImportPlan:
    in_dir: str
    out_dir: str
    dialect: str  # "paddlefleet" or "fork"
    cfg: Qwen3VHAConfig
    out_config: dict
    entries: List[Entry]
    layout: str
    notes: List[str] = field(default_factory=list)
    copy_files: List[str] = field(default_factory=list)
    shards: list = field(default_factory=list)
    folder: Optional[CheckpointFolder] = None

    @property
    def bytes_out(self) -> int:
        return sum(e.nbytes for e in self.entries)


def _normalize(name: str) -> Tuple[str, Optional[int], str]:
    """(our name of a plain tensor, layer index or None, the name inside the layer)."""
    n = name[len("model."):] if name.startswith("model.") else name
    if n in ("embedding.embed_tokens.weight", "embed_tokens.weight"):
        return "model.embed_tokens.weight", None, ""
    if n == "norm.weight":
        return "model.norm.weight", None, ""
    if n == "lm_head.weight":
        return "lm_head.weight", None, ""
    m = _LAYER.match(n)
    if m:
        return f"model.layers.{m.group(1)}.{m.group(2)}", int(m.group(1)), m.group(2)
    return "", None, ""


def _qkv_rows(cfg, layer: int, layout: str) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Output-feature indices of Q, K, V inside a fused qkv projection of layer `layer`."""
    dims = cfg.layer_dims(layer)
    h_kv, d, r, h_p = dims.num_kv_heads, dims.head_dim, dims.q_head_dim, dims.num_physical_heads
    if layout == "concat":
        q, k = h_p * r, h_kv * d
        return np.arange(q), np.arange(q, q + k), np.arange(q + k, q + 2 * k)
    if h_p % h_kv:
        raise FleetImportError(f"layer {layer}: a grouped qkv_proj needs the {h_p} physical query heads to split over "
                               f"the {h_kv} KV groups (use --qkv-layout concat if it is [all Q | all K | all V])")
    per_q = h_p // h_kv * r
    width = per_q + 2 * d  # one group: its query heads | K | V
    base = np.arange(h_kv)[:, None] * width
    q = (base + np.arange(per_q)).reshape(-1)
    k = (base + per_q + np.arange(d)).reshape(-1)
    v = (base + per_q + d + np.arange(d)).reshape(-1)
    return q, k, v


def _config_of(folder: CheckpointFolder) -> Tuple[Qwen3VHAConfig, str, dict]:
    raw = folder.config
    if raw.get("model_type") == "qwen3_vha" and not any(k in raw for k in UPSTREAM_KEYS):
        raise FleetImportError(f"{folder.path}: already a Qwen3-VHA checkpoint of this project (model_type qwen3_vha); "
                               "nothing to import")
    if raw.get("use_vha_attention") is None and raw.get("attn_type") is None:
        raise FleetImportError(f"{folder.path}: config.json has neither use_vha_attention (PaddleFleet) nor attn_type "
                               "'vha' (the research fork): not an upstream VHA config")
    try:
        check_config_fields(raw)
        cfg = Qwen3VHAConfig(**{k: v for k, v in raw.items() if k not in ("transformers_version",)})
    except (VHAConfigError, ValueError, TypeError) as e:
        raise FleetImportError(f"{folder.path}/config.json: {str(e).splitlines()[0] if str(e) else type(e).__name__}") \
            from None
    dialect = "fork" if "attn_type" in raw else "paddlefleet"
    out = cfg.to_dict()
    out["architectures"] = ["Qwen3VHAForCausalLM"]
    out["model_type"] = "qwen3_vha"
    for k in ("transformers_version", "dtype", "torch_dtype"):
        out.pop(k, None)
    return cfg, dialect, out


def plan_import(src, out_dir: str, layout: str = "paddle", qkv_layout: str = "grouped", up_gate_order: str = "gate-up",
                dtype: str = "auto", force: bool = False, max_shard_size="5GB") -> ImportPlan:
    """Validate an upstream checkpoint from its config and headers (no tensor data read) and plan every output
    tensor; FleetImportError (one line) for anything it cannot import."""
    if layout not in ("paddle", "hf") or qkv_layout not in QKV_LAYOUTS or up_gate_order not in UP_GATE_ORDERS:
        raise FleetImportError(f"layout {layout!r} / qkv layout {qkv_layout!r} / up-gate order {up_gate_order!r}: "
                               f"expected paddle|hf, {'|'.join(QKV_LAYOUTS)}, {'|'.join(UP_GATE_ORDERS)}")
    folder = CheckpointFolder.open(src)
    check_output_dir(out_dir, [folder.path], force, FleetImportError)
    cfg, dialect, out_config = _config_of(folder)
    folder.require_float()
    refs = folder.tensors
    want = tensor_shapes(cfg)  # our names -> [out, in] shapes
    entries: Dict[str, Entry] = {}
    notes: List[str] = []
    unknown = []
    tr = layout == "paddle"

    def code_of(ref):
        return ref.dtype if dtype == "auto" else st.dtype_code(dtype)

    for name in sorted(refs, key=st.natural_key):
        ref = refs[name]
        ours, layer, rest = _normalize(name)
        if not ours:
            unknown.append(name)
            continue
        if rest in ("self_attn.qkv_proj.weight", "self_attn.qkv_proj.bias"):
            rows = _qkv_rows(cfg, layer, qkv_layout)
            kind = rest.rsplit(".", 1)[1]
            axis = (1 if tr else 0) if kind == "weight" else 0
            for part, (proj, idx) in enumerate(zip(("q_proj", "k_proj", "v_proj"), rows)):
                out_name = f"model.layers.{layer}.self_attn.{proj}.{kind}"
                total = sum(len(x) for x in rows)
                if ref.shape[axis] != total:
                    raise FleetImportError(f"{name}: shape {list(ref.shape)} has {ref.shape[axis]} output features, "
                                           f"expected {total} (Q, K, V of layer {layer})")
                shape = (len(idx), ref.shape[1 - axis]) if kind == "weight" else (len(idx),)
                entries[out_name] = Entry(out_name, name, "split", shape, code_of(ref), (axis, part, 3), idx)
            continue
        if rest == "mlp.up_gate_proj.weight":
            axis = 1 if tr else 0
            n = ref.shape[axis]
            if n % 2:
                raise FleetImportError(f"{name}: {n} output features cannot be halves of gate_proj and up_proj")
            halves = ("gate_proj", "up_proj") if up_gate_order == "gate-up" else ("up_proj", "gate_proj")
            for part, proj in enumerate(halves):
                out_name = f"model.layers.{layer}.mlp.{proj}.weight"
                idx = np.arange(part * n // 2, (part + 1) * n // 2)
                entries[out_name] = Entry(out_name, name, "split", (n // 2, ref.shape[1 - axis]), code_of(ref),
                                          (axis, part, 2), idx)
            continue
        linear = bool(_LINEAR.search(ours)) or ours == "lm_head.weight"
        how = "transpose" if linear and tr else "copy"
        shape = tuple(reversed(ref.shape)) if how == "transpose" else tuple(ref.shape)
        if ours in entries:
            raise FleetImportError(f"{name}: a second tensor for {ours}")
        entries[ours] = Entry(ours, name, how, shape, code_of(ref))

    if unknown:
        raise FleetImportError(f"{folder.path}: tensors with names this importer does not know: {few(unknown)}")
    if cfg.tie_word_embeddings and "lm_head.weight" in entries:
        emb, head = entries["model.embed_tokens.weight"], entries["lm_head.weight"]
        a, b = folder.read(emb.source), folder.read(head.source)
        b = b.T if head.how == "transpose" else b
        if a.shape != b.shape or not np.array_equal(a, b):
            raise FleetImportError(f"{folder.path}: tie_word_embeddings is true but {head.source} differs from "
                                   f"{emb.source}")
        del entries["lm_head.weight"]
        notes.append(f"tied embeddings: {head.source} equals {emb.source}, not written twice")
    zero_bias = [n for n in want if n.endswith("o_proj.bias") and n not in entries]
    if zero_bias and not [n for n in entries if n.endswith("o_proj.bias")]:
        code = entries["model.embed_tokens.weight"].code if "model.embed_tokens.weight" in entries else "F32"
        for n in zero_bias:
            entries[n] = Entry(n, None, "zeros", want[n], code)
        notes.append("attention_bias: upstream has no o_proj bias, Qwen3 has one: written as zeros (same function)")
    try:
        compare_shapes(folder.path, {n: e.shape for n, e in entries.items()}, want)
    except CheckpointError as e:
        raise FleetImportError(str(e)) from None

    copy_files, folders = folder.side_files()  # tokenizer, generation config, ...
    plan = ImportPlan(folder.path, os.path.abspath(out_dir), dialect, cfg, out_config,
                      sorted(entries.values(), key=lambda e: st.natural_key(e.name)), layout, notes, copy_files,
                      folder=folder)
    plan.shards = st.plan_shards([(e.name, e.code, e.shape) for e in plan.entries], st.parse_size(max_shard_size))
    if folders:
        plan.notes.append(f"not copied (folders): {', '.join(folders)}")
    return plan


def format_plan(plan: ImportPlan) -> str:
    cfg = plan.cfg
    full = cfg.full_dims()
    lines = [
        f"import_fleet {plan.in_dir} -> {plan.out_dir}",
        f"  read as: {'PaddleFleet SelfAttentionVHA' if plan.dialect == 'paddlefleet' else 'research fork (attn_type vha)'}"
        f" config, {plan.layout} layout",
        f"  Qwen3-VHA: {cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}, H_v {full.num_heads} virtual / H_p "
        f"{full.num_physical_heads} physical query heads (r {full.q_head_dim}), H_kv {full.num_kv_heads}, d "
        f"{full.head_dim}, Postmix rank {full.postmix_rank}"
        + (", shared KV" if cfg.vha_shared_kv else "") + (", gated" if cfg.vha_gated_attention else ""),
    ]
    windows = cfg.window_layers()
    if windows:
        w = cfg.layer_dims(windows[0])
        lines.append(f"  sliding-window layers {windows} (window {w.window}): H_v {w.num_heads}, H_kv {w.num_kv_heads}, "
                     f"d {w.head_dim}, r {w.q_head_dim}, Postmix rank {w.postmix_rank}, RoPE base {w.rope_theta:g}")
    lines.append("  tensors (output name pattern, count, how, input -> output shape):")
    groups: Dict[tuple, list] = {}
    for e in plan.entries:
        key = (re.sub(r"layers\.\d+\.", "layers.{i}.", e.name), e.how,
               re.sub(r"layers\.\d+\.", "layers.{i}.", e.source or "-"), e.shape)
        groups.setdefault(key, []).append(e)
    folder = plan.folder
    for (pattern, how, source, shape), es in groups.items():
        src_shape = list(folder.tensors[es[0].source].shape) if es[0].source else "-"
        lines.append(f"    {pattern:<46} x{len(es):<3} {how:<9} {source} {src_shape} -> {list(shape)} "
                     f"{st.dtype_name(es[0].code)}")
    lines.append(f"  bytes out: {fmt_bytes(plan.bytes_out, fixed=True)} in {len(plan.shards)} shard(s)")
    lines.append(f"  files copied: {', '.join(plan.copy_files) if plan.copy_files else '(none)'}")
    lines += [f"  note: {n}" for n in plan.notes]
    return "\n".join(lines)


def _produce(plan: ImportPlan, e: Entry) -> np.ndarray:
    if e.how == "zeros":
        return np.zeros(e.shape, np.float64)
    a = plan.folder.read(e.source)
    if e.how == "transpose":
        return a.T
    if e.how == "split":
        axis = e.part[0]
        a = np.take(a, e.rows, axis=axis)
        return a.T if axis == 1 and a.ndim == 2 else a
    return a


def import_checkpoint(plan: ImportPlan, progress: bool = True, on_written: Optional[Callable] = None) -> None:
    """Write plan.out_dir (atomically; refuses NaN / Inf and overflowing casts with one line naming the tensor)."""
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=plan.bytes_out, unit="B", unit_scale=True, desc="import", leave=False)

    by_name = {e.name: e for e in plan.entries}

    def chunks(name, code, shape):
        try:
            yield st.cast_finite(np.ascontiguousarray(_produce(plan, by_name[name])), code, name)
        except ValueError as err:  # NaN / Inf in the input, or a cast that overflows: nothing is written
            raise FleetImportError(f"{plan.in_dir}: {err}; refusing to import") from None

    def written(name, nbytes):
        if bar is not None:
            bar.update(nbytes)
        if on_written is not None:
            on_written(name, nbytes)

    try:
        with atomic_dir(plan.out_dir, tool="import_fleet", replace=True, error=FleetImportError) as tmp:
            write_checkpoint_folder(tmp, plan.shards, chunks, plan.out_config, plan.bytes_out, copy_from=plan.in_dir,
                                    copy_files=plan.copy_files, on_written=written)
    finally:
        if bar is not None:
            bar.close()


def reference_names(folder: CheckpointFolder) -> Dict[str, str]:
    """fleet_reference's keys ('embed', 'norm', 'lm_head', 'L{i}.<rest>') -> the input checkpoint's tensor names."""
    out = {}
    for name in folder.tensors:
        ours, layer, rest = _normalize(name)
        key = {"model.embed_tokens.weight": "embed", "model.norm.weight": "norm", "lm_head.weight": "lm_head"}.get(ours)
        out[key or f"L{layer}.{rest}"] = name
    return out


def verify_import(plan: ImportPlan, qkv_layout: str = "grouped", up_gate_order: str = "gate-up",
                  num_sequences: int = 2, seq_len: int = 16, seed: int = 0) -> Dict[str, float]:
    """Upstream's forward on the INPUT tensors (paddle_vha/vha/fleet_reference.py, float64 numpy, upstream's einsum
    and layouts) vs this project's Qwen3VHAForCausalLM loaded from the OUTPUT (Paddle float32), on random tokens:
    max_abs, max_rel, mean_kl, nonfinite (paddle_vha.evaluate.compare_logits)."""
    import tempfile

    import paddle

    from ..checkpoint.fsutil import linked_view
    from ..evaluate import compare_logits
    from .fleet_reference import reference_logits
    from .modeling import Qwen3VHAForCausalLM

    folder = plan.folder
    ids = np.random.default_rng(seed).integers(0, plan.cfg.vocab_size, size=(num_sequences, seq_len))
    ref = reference_logits(ids, lambda n: st.to_float64(folder.read(n)), reference_names(folder), plan.cfg,
                           plan.layout, qkv_layout, up_gate_order)
    with tempfile.TemporaryDirectory(prefix="vha-import-verify-") as tmp:
        model = Qwen3VHAForCausalLM.from_pretrained(linked_view(plan.out_dir, os.path.join(tmp, "out")),
                                                    dtype="float32")
        model.eval()
        with paddle.no_grad():
            got = model(paddle.to_tensor(ids), return_dict=True).logits.astype("float64").numpy()
    return compare_logits(ref, got)
