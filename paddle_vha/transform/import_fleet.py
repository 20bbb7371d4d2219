"""A VHA checkpoint written by PaddleFleet (upstream names, config and Paddle's [in, out] layout) -> this project's
Qwen3-VHA contract (docs/checkpoint.md), tensor by tensor (what tools/import_fleet.py runs).

Input tensor names, after an optional leading `model.`:
    embedding.embed_tokens.weight | embed_tokens.weight        -> model.embed_tokens.weight
    norm.weight, lm_head.weight                                -> model.norm.weight, lm_head.weight
    layers.{i}.<rest>                                          -> model.layers.{i}.<rest>, where in <rest>
        self_attn.core_attention.softmax_offset  [H_v]          -> self_attn.sinks (upstream's sink logits on a window
                                                                  layer, add_swa_attention_sink_bias; its HF export's
                                                                  `self_attn.sinks` is the same tensor)
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
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np

from ..checkpoint import safetensors_io as st
from ..checkpoint.contract import CheckpointError, compare_shapes, few
from ..checkpoint.folder import CheckpointFolder
from ..evaluate import compare_logits
from ..families import family
from ..moe.config import MoEConfigError
from ..moe_vha import fleet_moe
from ..qwen3.contract import check_config_fields
from ..transform import Description, Entry, Table, TransformPlan, check_dtype, layer_pattern, output_code, write_plan
from ..transform.describe import files_line, group, skipped_lines
from ..transform.plan import open_output
from ..transform.verify import folder_logits, left_unchanged, model_logits, random_tokens
from ..units import fmt_bytes
from ..vha.config import Qwen3VHAConfig, VHAConfigError
from ..vha.fleet_config import QKV_LAYOUTS, UP_GATE_ORDERS, UPSTREAM_KEYS
from .fleet_reference import SINK_NAMES

__all__ = ["FleetImportError", "ImportPlan", "plan_import", "import_checkpoint", "verify_import", "QKV_LAYOUTS",
           "UP_GATE_ORDERS"]

_LAYER = re.compile(r"^layers\.(\d+)\.(.+)$")
# upstream MoE tensors whose name or layout differs from ours (paddle_vha/moe_vha/fleet_moe.py)
_MOE = re.compile(r"^mlp\.(experts\.\d+\.up_gate_proj\.weight|shared_experts\..+|grouped_gemm_experts\.weight[12]|"
                  r"gate\.e_score_correction_bias)$")
_LINEAR = re.compile(r"(_proj)\.weight$")


class FleetImportError(CheckpointError):
    """An input import_fleet refuses; the message is one line naming the problem."""


@dataclass(kw_only=True)
class ImportPlan(TransformPlan):
    """plan_import's plan: cfg is the Qwen3-VHA config written; how the upstream checkpoint was read."""

    tool, verb = "import_fleet", "import"
    error = FleetImportError

    dialect: str  # "paddlefleet" or "fork"
    layout: str  # "paddle" ([in, out] Linear weights) or "hf"
    qkv_layout: str = "grouped"
    up_gate_order: str = "gate-up"

    def refused(self, err: Exception) -> CheckpointError:
        return self.error(f"{self.in_dir}: {err}; refusing to import")

    @property
    def verify_how(self) -> str:
        """What --verify compares upstream's forward with: the imported model in Paddle, or (no Paddle model: a
        Qwen3-MoE-VHA import) the imported checkpoint through the float64 numpy forward."""
        fam = family(self.cfg.model_type)
        return f"the imported {fam.label} ({'Paddle float32' if fam.has_model else 'float64 numpy'})"

    def describe(self) -> Description:
        cfg = self.cfg
        full = cfg.full_dims()
        read_as = 'PaddleFleet SelfAttentionVHA' if self.dialect == 'paddlefleet' else 'research fork (attn_type vha)'
        header = [
            f"read as: {read_as} config, {self.layout} layout",
            *fleet_moe.plan_header(cfg),  # the routed experts of a Qwen3-MoE-VHA import
            f"Qwen3-VHA: {cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}, H_v {full.num_heads} virtual / H_p "
            f"{full.num_physical_heads} physical query heads (r {full.q_head_dim}), H_kv {full.num_kv_heads}, d "
            f"{full.head_dim}, Postmix rank {full.postmix_rank}"
            + (", shared KV" if cfg.vha_shared_kv else "") + (", gated" if cfg.vha_gated_attention else ""),
        ]
        windows = cfg.window_layers()
        if windows:
            w = cfg.layer_dims(windows[0])
            header.append(f"sliding-window layers {windows} (window {w.window}): H_v {w.num_heads}, H_kv "
                          f"{w.num_kv_heads}, d {w.head_dim}, r {w.q_head_dim}, Postmix rank {w.postmix_rank}, RoPE "
                          f"base {w.rope_theta:g}")
        footer = [f"bytes out: {fmt_bytes(self.bytes_out, fixed=True)} in {len(self.shards)} shard(s)",
                  files_line(self), *skipped_lines(self)]
        return Description(f"import_fleet {self.in_dir} -> {self.out_dir}", header, self._table(), footer, self.notes)

    def _table(self) -> Table:
        def key(e):
            return layer_pattern(e.name), e.how, layer_pattern(e.sources[0]) if e.sources else "-", e.shape

        rows = []
        for (pattern, how, source, shape), es in group(self.entries, key).items():
            src_shape = list(self.inputs[es[0].sources[0]].shape) if es[0].sources else "-"
            rows.append((pattern, f"x{len(es)}", how,
                         f"{source} {src_shape} -> {list(shape)} {st.dtype_name(es[0].code)}"))
        return Table("tensors (output name pattern, count, how, input -> output shape):", (46, 4, 9), rows)


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
    ours = tuple(c.model_type for c in fleet_moe.IMPORTED)
    if raw.get("model_type") in ours and not any(k in raw for k in UPSTREAM_KEYS):
        raise FleetImportError(f"{folder.path}: already a {family(raw['model_type']).label} checkpoint of this project "
                               f"(model_type {raw['model_type']}); nothing to import")
    if raw.get("use_vha_attention") is None and raw.get("attn_type") is None:
        raise FleetImportError(f"{folder.path}: config.json has neither use_vha_attention (PaddleFleet) nor attn_type "
                               "'vha' (the research fork): not an upstream VHA config")
    try:
        check_config_fields(raw)
        cls, fields = fleet_moe.read_config(raw)  # Qwen3-MoE-VHA with routed experts, else Qwen3-VHA
        cfg = cls(**{k: v for k, v in fields.items() if k not in ("transformers_version", "model_type")})
    except (VHAConfigError, MoEConfigError, ValueError, TypeError) as e:
        raise FleetImportError(f"{folder.path}/config.json: {str(e).splitlines()[0] if str(e) else type(e).__name__}") \
            from None
    if not cfg.vha_premix:
        raise FleetImportError(f"{folder.path}/config.json: vha_enable_premix=false (premix-off VHA): its config reads "
                               "(Qwen3VHAConfig), but importing its tensors is not supported; convert the stock source "
                               "with tools/convert_to_vha.py --premix off instead")
    dialect = "fork" if "attn_type" in raw else "paddlefleet"
    out = cfg.to_dict()
    out["architectures"] = [cfg.causal_lm_name]
    out["model_type"] = cfg.model_type
    for k in ("transformers_version", "dtype", "torch_dtype"):
        out.pop(k, None)
    return cfg, dialect, out


def _split_qkv(ref: st.TensorRef, cfg, layer: int, leaf: str, qkv_layout: str, tr: bool, code: str) -> List[Entry]:
    """q_proj, k_proj, v_proj (leaf weight or bias) of layer `layer` from its fused qkv_proj."""
    rows = _qkv_rows(cfg, layer, qkv_layout)
    axis = (1 if tr else 0) if leaf == "weight" else 0
    total = sum(len(x) for x in rows)
    if ref.shape[axis] != total:
        raise FleetImportError(f"{ref.name}: shape {list(ref.shape)} has {ref.shape[axis]} output features, "
                               f"expected {total} (Q, K, V of layer {layer})")
    return [Entry(f"model.layers.{layer}.self_attn.{proj}.{leaf}",
                  (len(idx), ref.shape[1 - axis]) if leaf == "weight" else (len(idx),), code, "split", (ref.name,),
                  (axis, idx)) for proj, idx in zip(("q_proj", "k_proj", "v_proj"), rows)]


def _split_up_gate(ref: st.TensorRef, layer: int, up_gate_order: str, tr: bool, code: str,
                   mlp: str = "mlp") -> List[Entry]:
    """gate_proj and up_proj of layer `layer`'s MLP `mlp` (mlp, mlp.experts.{e}, mlp.shared_expert) from its fused
    up_gate_proj (halves in `up_gate_order`)."""
    axis = 1 if tr else 0
    n = ref.shape[axis]
    if n % 2:
        raise FleetImportError(f"{ref.name}: {n} output features cannot be halves of gate_proj and up_proj")
    halves = ("gate_proj", "up_proj") if up_gate_order == "gate-up" else ("up_proj", "gate_proj")
    return [Entry(f"model.layers.{layer}.{mlp}.{proj}.weight", (n // 2, ref.shape[1 - axis]), code, "split", (ref.name,),
                  (axis, np.arange(part * n // 2, (part + 1) * n // 2))) for part, proj in enumerate(halves)]


def _grouped(ref: st.TensorRef, layer: int, which: str, up_gate_order: str, tr: bool, code: str) -> List[Entry]:
    """Every expert's tensors from a grouped-GEMM weight: weight1 [E, h, 2 I_e] (gate | up per expert) or weight2
    [E, I_e, h] (down), Paddle layout (each expert's block [in, out]); how "expert": take = (e, output columns)."""
    if len(ref.shape) != 3 or not tr:
        raise FleetImportError(f"{ref.name}: shape {list(ref.shape)}: a grouped-GEMM expert weight is read as "
                               "[E, in, out] (Paddle layout, 3-D); import the per-expert form otherwise")
    E, n_in, n_out = ref.shape
    out = []
    for e in range(E):
        if which == "weight2":
            out.append(Entry(f"model.layers.{layer}.mlp.experts.{e}.down_proj.weight", (n_out, n_in), code, "expert",
                             (ref.name,), (e, np.arange(n_out))))
            continue
        halves = ("gate_proj", "up_proj") if up_gate_order == "gate-up" else ("up_proj", "gate_proj")
        out += [Entry(f"model.layers.{layer}.mlp.experts.{e}.{proj}.weight", (n_out // 2, n_in), code, "expert",
                      (ref.name,), (e, np.arange(k * n_out // 2, (k + 1) * n_out // 2))) for k, proj in enumerate(halves)]
    return out


def _moe_entries(ref: st.TensorRef, layer: int, rest: str, up_gate_order: str, tr: bool, code: str) -> List[Entry]:
    """Our tensors from one upstream MoE tensor: a fused expert or shared-expert up_gate_proj, the shared expert's
    down_proj and gate (renamed), grouped-GEMM expert weights; a router correction bias is refused."""
    if rest.endswith("e_score_correction_bias"):
        raise FleetImportError(f"{ref.name}: a router correction bias (topk_method noaux_tc): Qwen3-MoE's router has "
                               "none, so the routing would differ; refusing to import")
    if rest.startswith("mlp.grouped_gemm_experts."):
        return _grouped(ref, layer, rest.rsplit(".", 1)[1], up_gate_order, tr, code)
    if rest.endswith("up_gate_proj.weight"):
        mlp = "mlp.shared_expert" if rest.startswith("mlp.shared_experts.") else rest[: -len(".up_gate_proj.weight")]
        return _split_up_gate(ref, layer, up_gate_order, tr, code, mlp)
    ours = fleet_moe.SHARED_RENAMES.get(rest[len("mlp."):])
    if ours is None:
        raise FleetImportError(f"{ref.name}: a shared-expert tensor this importer does not know")
    shape = tuple(reversed(ref.shape)) if tr else tuple(ref.shape)
    return [Entry(f"model.layers.{layer}.mlp.{ours}", shape, code, "transpose" if tr else "copy", (ref.name,))]


def _add(entries: Dict[str, Entry], name: str, parts: List[Entry]) -> None:
    """The parts of fused input tensor `name`, refused when another input tensor already makes one of them (a separate
    q_proj beside a fused qkv_proj: which one is the model?)."""
    for e in parts:
        if e.name in entries:
            raise FleetImportError(f"{entries[e.name].sources[0]}: a second tensor for {e.name} (the fused {name} "
                                   "makes it too); refusing to import an ambiguous checkpoint")
        entries[e.name] = e


def _entries(folder: CheckpointFolder, cfg, tr: bool, qkv_layout: str, up_gate_order: str,
             dtype: str) -> Dict[str, Entry]:
    """Our tensor name -> Entry, for every input tensor (fused ones split); FleetImportError for unknown names."""
    entries: Dict[str, Entry] = {}
    unknown = []
    for name in sorted(folder.tensors, key=st.natural_key):
        ref, code = folder.tensors[name], output_code(dtype, folder.tensors, like=name)  # auto: the tensor's own
        ours, layer, rest = _normalize(name)
        if not ours:
            unknown.append(name)
        elif rest in ("self_attn.qkv_proj.weight", "self_attn.qkv_proj.bias"):
            _add(entries, name, _split_qkv(ref, cfg, layer, rest.rsplit(".", 1)[1], qkv_layout, tr, code))
        elif rest in SINK_NAMES and f"model.layers.{layer}.self_attn.sinks" not in entries:
            ours = f"model.layers.{layer}.self_attn.sinks"  # upstream's softmax_offset: one logit per virtual head
            entries[ours] = Entry(ours, tuple(ref.shape), code, "copy", (name,))
        elif rest == "mlp.up_gate_proj.weight":
            _add(entries, name, _split_up_gate(ref, layer, up_gate_order, tr, code))
        elif _MOE.match(rest):
            _add(entries, name, _moe_entries(ref, layer, rest, up_gate_order, tr, code))
        elif ours in entries:
            raise FleetImportError(f"{name}: a second tensor for {ours} ({entries[ours].sources[0]} makes it too); "
                                   "refusing to import an ambiguous checkpoint")
        else:
            linear = bool(_LINEAR.search(ours)) or ours == "lm_head.weight"
            how = "transpose" if linear and tr else "copy"
            entries[ours] = Entry(ours, tuple(reversed(ref.shape)) if how == "transpose" else tuple(ref.shape), code,
                                  how, (name,))
    if unknown:
        raise FleetImportError(f"{folder.path}: tensors with names this importer does not know: {few(unknown)}")
    return entries


def _drop_tied_head(folder: CheckpointFolder, cfg, entries: Dict[str, Entry]) -> List[str]:
    """A tied lm_head must equal the embedding (read both); it is then not written. Returns the plan's notes."""
    if not (cfg.tie_word_embeddings and "lm_head.weight" in entries):
        return []
    emb, head = entries["model.embed_tokens.weight"].sources[0], entries["lm_head.weight"]
    a, b = folder.read(emb), folder.read(head.sources[0])
    b = b.T if head.how == "transpose" else b
    if a.shape != b.shape or not np.array_equal(a, b):
        raise FleetImportError(f"{folder.path}: tie_word_embeddings is true but {head.sources[0]} differs from {emb}")
    del entries["lm_head.weight"]
    return [f"tied embeddings: {head.sources[0]} equals {emb}, not written twice"]


def _zero_o_bias(entries: Dict[str, Entry], want) -> List[str]:
    """Upstream's attention_bias has no o_proj bias, Qwen3's has: zeros (the same function). Returns the notes."""
    zero_bias = [n for n in want if n.endswith("o_proj.bias") and n not in entries]
    if not zero_bias or [n for n in entries if n.endswith("o_proj.bias")]:
        return []
    code = entries["model.embed_tokens.weight"].code if "model.embed_tokens.weight" in entries else "F32"
    for n in zero_bias:
        entries[n] = Entry(n, tuple(want[n]), code, "zeros")
    return ["attention_bias: upstream has no o_proj bias, Qwen3 has one: written as zeros (same function)"]


def _fused_layouts(folder: CheckpointFolder, cfg, qkv_layout: Optional[str],
                   up_gate_order: Optional[str]) -> Tuple[str, str]:
    """The layouts of the fused projections: upstream records neither in config.json (the research fork's
    Qwen3-1.7B-VHA config at 7218402 has no such field; PaddleFleet's flex-checkpoint AOA statements are generated by
    its code, not saved), and --verify reads the input under the same assumption, so a fused tensor whose layout is
    not forced by its shapes needs the flag: refused in one line without it. qkv: grouped and concat coincide when
    every layer has one KV group."""
    rests = {_normalize(n)[2] for n in folder.tensors}
    if any(r.endswith("up_gate_proj.weight") or r.endswith("grouped_gemm_experts.weight1") for r in rests):
        rests.add("mlp.up_gate_proj.weight")  # a fused expert / shared expert: the same statement is needed
    fused_qkv = bool(rests & {"self_attn.qkv_proj.weight", "self_attn.qkv_proj.bias"})
    if qkv_layout is not None and not fused_qkv:  # given and then unused: refused, never ignored
        raise FleetImportError(f"--qkv-layout has no effect in this run: it takes effect when IN_DIR holds a fused "
                               f"qkv_proj ({folder.path} stores q_proj / k_proj / v_proj apart)")
    if up_gate_order is not None and "mlp.up_gate_proj.weight" not in rests:
        raise FleetImportError(f"--up-gate-order has no effect in this run: it takes effect when IN_DIR holds a fused "
                               f"up_gate_proj ({folder.path} stores gate_proj / up_proj apart)")
    if qkv_layout is None:
        if not fused_qkv:
            qkv_layout = "grouped"  # nothing fused: unused
        elif all(cfg.layer_dims(i).num_kv_heads == 1 for i in range(cfg.num_hidden_layers)):
            qkv_layout = "concat"  # one KV group: [Q | K | V] either way
        else:
            raise FleetImportError(f"{folder.path}: a fused qkv_proj and config.json does not record its layout "
                                   "(grouped [per KV group: its query heads | K | V] or concat [all Q | all K | all V], "
                                   "which --verify cannot tell apart): pass --qkv-layout")
    if up_gate_order is None:
        if "mlp.up_gate_proj.weight" in rests:
            raise FleetImportError(f"{folder.path}: a fused up_gate_proj and config.json does not record which half is "
                                   "the gate (--verify cannot tell): pass --up-gate-order gate-up or up-gate")
        up_gate_order = "gate-up"  # nothing fused: unused
    return qkv_layout, up_gate_order


def plan_import(src, out_dir: str, layout: str = "paddle", qkv_layout: Optional[str] = None,
                up_gate_order: Optional[str] = None, dtype: str = "auto", force: bool = False,
                max_shard_size="5GB") -> ImportPlan:
    """Validate an upstream checkpoint from its config and headers (no tensor data read but a tied lm_head's) and
    plan every output tensor; FleetImportError (one line) for anything it cannot import. qkv_layout / up_gate_order
    None: a fused projection whose layout its shapes do not force is refused (_fused_layouts)."""
    if layout not in ("paddle", "hf") or qkv_layout not in (*QKV_LAYOUTS, None) \
            or up_gate_order not in (*UP_GATE_ORDERS, None):
        raise FleetImportError(f"layout {layout!r} / qkv layout {qkv_layout!r} / up-gate order {up_gate_order!r}: "
                               f"expected paddle|hf, {'|'.join(QKV_LAYOUTS)}, {'|'.join(UP_GATE_ORDERS)}")
    check_dtype(dtype, FleetImportError)
    folder = CheckpointFolder.open(src)
    cfg, dialect, out_config = _config_of(folder)
    open_output(folder, out_dir, force, FleetImportError)
    qkv_layout, up_gate_order = _fused_layouts(folder, cfg, qkv_layout, up_gate_order)
    entries = _entries(folder, cfg, layout == "paddle", qkv_layout, up_gate_order, dtype)
    want = family(cfg.model_type).tensor_shapes(cfg)  # our names -> [out, in] shapes
    notes = _drop_tied_head(folder, cfg, entries) + _zero_o_bias(entries, want)
    try:
        compare_shapes(folder.path, {n: e.shape for n, e in entries.items()}, want)
    except CheckpointError as e:
        raise FleetImportError(str(e)) from None
    return ImportPlan.build(folder, os.path.abspath(out_dir), entries.values(), max_shard_size, cfg=cfg,
                            out_config=out_config, out_code=None if dtype == "auto" else st.dtype_code(dtype),
                            force=force, notes=notes, dialect=dialect, layout=layout, qkv_layout=qkv_layout,
                            up_gate_order=up_gate_order)


def _make(plan: ImportPlan, e: Entry) -> np.ndarray:
    """A tensor that is not a plain copy: zeros, a transposed Linear weight, or a part of a fused one."""
    if e.how == "zeros":
        return np.zeros(e.shape, np.float64)
    if e.how == "expert":  # one expert's block of a grouped-GEMM weight [E, in, out] (its rows only), some columns
        expert, cols = e.take
        return st.read_rows(plan.inputs[e.sources[0]], expert, expert + 1)[0][:, cols].T
    a = plan.source.read(e.sources[0])
    if e.how == "transpose":
        return a.T
    axis, rows = e.take  # "split"
    a = np.take(a, rows, axis=axis)
    return a.T if axis == 1 and a.ndim == 2 else a


def import_checkpoint(plan: ImportPlan, progress: bool = True,
                      on_tensor: Optional[Callable[[Entry], None]] = None) -> str:
    """Write plan.out_dir (atomically; refuses NaN / Inf and overflowing casts with one line naming the tensor)."""
    return write_plan(plan, lambda e: _make(plan, e), progress, on_tensor=on_tensor)


def reference_names(folder: CheckpointFolder) -> Dict[str, str]:
    """fleet_reference's keys ('embed', 'norm', 'lm_head', 'L{i}.<rest>') -> the input checkpoint's tensor names."""
    out = {}
    for name in folder.tensors:
        ours, layer, rest = _normalize(name)
        key = {"model.embed_tokens.weight": "embed", "model.norm.weight": "norm", "lm_head.weight": "lm_head"}.get(ours)
        out[key or f"L{layer}.{rest}"] = name
    return out


def verify_import(plan: ImportPlan, num_sequences: int = 2, seq_len: int = 16, seed: int = 0) -> Dict[str, float]:
    """Upstream's forward on the INPUT tensors (paddle_vha/transform/fleet_reference.py, float64 numpy, upstream's einsum
    and layouts, read as the plan read them) vs this project's Qwen3VHAForCausalLM loaded from the OUTPUT (Paddle
    float32), on random tokens: max_abs, max_rel, mean_kl, nonfinite (paddle_vha.evaluate.compare_logits)."""
    from .fleet_reference import reference_logits

    folder = plan.source
    with left_unchanged(plan.in_dir, plan.out_dir):
        ids = random_tokens(plan.cfg.vocab_size, num_sequences, seq_len, seed)
        ref = reference_logits(ids, lambda n: st.to_float64(folder.read(n)), reference_names(folder), plan.cfg,
                               plan.layout, plan.qkv_layout, plan.up_gate_order)
        fam = family(plan.cfg.model_type)
        # Qwen3-MoE-VHA has no Paddle model: the imported checkpoint through this project's float64 numpy forward
        got = model_logits(plan.out_dir, [ids], fam.model_class) if fam.has_model else folder_logits(plan.out_dir, ids)
    return compare_logits(ref, got)
