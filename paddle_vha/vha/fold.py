"""Fold a Qwen3-VHA checkpoint into a stock Qwen3 GQA checkpoint (exact, float64, streaming).

The math (docs/method.md, "Why it folds"), in on-disk layout (Linear weights [out, in]):

    q_proj:  W_Q [H_p*r, h] and Premix P [H_kv, r, d]  ->  W_Q' [H_v*d, h]
             block j = g*H_p + i of W_Q' is P[g]^T W_Q^(i)       (Q_v[j] = x W_Q^(i)T P[g]);  b_q'[j] = b_q^(i) P[g]
    o_proj:  W_O [h, H_v*d], M = I + V U^T [H_v, H_v]       ->  W_O' [h, H_v*d]
             input block k of W_O' is sum_j M[j, k] W_O[:, j]   (W_O' = W_O (M (x) I_d))
    everything else is copied; vha_premix_weight / vha_postmix_U / vha_postmix_V disappear.

Three levels of API, each used by the next:
    fold_q_proj / fold_q_bias / fold_o_proj    one layer's tensors (float64 numpy)
    fold_state_dict(state, cfg)                a whole in-memory state dict
    plan_fold(src, ...) + fold_checkpoint      folder -> folder, tensor by tensor (what tools/fold.py runs); src is a
                                               path or an opened paddle_vha.checkpoint.CheckpointFolder

`fold_checkpoint` holds at most one folded attention tensor's inputs and output in float64 plus one
`chunk_bytes` block of a copied tensor, whatever the model size: inputs are read with pread row ranges
(never the whole shard), outputs stream into shards whose headers are written first.
"""
from __future__ import annotations

import os
import re
import tempfile
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Mapping, Optional, Tuple

import numpy as np

from paddleformers.transformers import Qwen3Config

from ..checkpoint import safetensors_io as st
from ..checkpoint.contract import INDEX_FILE, CheckpointError
from ..checkpoint.folder import CheckpointFolder, write_checkpoint_folder
from ..checkpoint.fsutil import atomic_dir, check_output_dir, linked_view
from ..evaluate import compare_logits
from ..families import family, family_of
from ..shared_kv.config import Qwen3SharedKVConfig
from ..units import fmt_bytes
from .config import Qwen3VHAConfig
from .spec import VHA_ONLY

__all__ = [
    "FoldError",
    "FoldPlan",
    "fold_checkpoint",
    "fold_config",
    "fold_o_proj",
    "fold_q_bias",
    "fold_q_proj",
    "fold_state_dict",
    "format_plan",
    "plan_fold",
    "verify_fold",
    "DEFAULT_VERIFY_TOL",
]

DTYPE_CHOICES = ("auto", "float32", "float64", "bfloat16", "float16")
# --verify: max |logit diff| / max |logit| allowed, by output dtype (storage rounding of the folded q/o weights).
DEFAULT_VERIFY_TOL = {"float64": 1e-4, "float32": 1e-4, "float16": 1e-2, "bfloat16": 5e-2}
GATE_REASON = "Postmix cannot cross the sigmoid gate"


class FoldError(CheckpointError):
    """A checkpoint (or output location) fold refuses; the message is one line naming the problem."""


# --- one layer -------------------------------------------------------------------------------------------------

def fold_q_proj(w_q: np.ndarray, premix: np.ndarray) -> np.ndarray:
    """[H_p*r, h] q_proj and [H_kv, r, d] Premix -> [H_v*d, h] stock q_proj (float64), virtual heads group-major."""
    h_kv, r, d = premix.shape
    w = np.asarray(w_q, np.float64).reshape(-1, r, w_q.shape[-1])  # (H_p, r, h)
    p_t = np.asarray(premix, np.float64).transpose(0, 2, 1)  # (H_kv, d, r)
    out = np.matmul(p_t[:, None], w[None])  # (H_kv, 1, d, r) @ (1, H_p, r, h) -> (H_kv, H_p, d, h): block g*H_p + i
    return out.reshape(h_kv * w.shape[0] * d, w.shape[-1])  # (H_v*d, h)


def fold_q_bias(b_q: np.ndarray, premix: np.ndarray) -> np.ndarray:
    """[H_p*r] q bias -> [H_v*d]: virtual head g*H_p + i gets b^(i) P[g]."""
    h_kv, r, d = premix.shape
    b = np.asarray(b_q, np.float64).reshape(-1, r)  # (H_p, r)
    return np.einsum("ir,grd->gid", b, np.asarray(premix, np.float64)).reshape(-1)  # (H_kv*H_p*d,)


def fold_o_proj(w_o: np.ndarray, u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """[h, H_v*d] o_proj and Postmix U, V [H_v, R] -> [h, H_v*d]: input block k is sum_j M[j, k] W_O[:, j]."""
    h_v = u.shape[0]
    m = np.eye(h_v) + np.asarray(v, np.float64) @ np.asarray(u, np.float64).T  # (H_v, H_v), M = I + V U^T
    w = np.asarray(w_o, np.float64).reshape(w_o.shape[0], h_v, -1)  # (h, H_v, d)
    out = np.matmul(m.T, w)  # (H_v, H_v) @ (h, H_v, d) -> (h, H_v, d): block k = sum_j M[j, k] W[:, j]
    return out.reshape(w_o.shape)  # (h, H_v*d)


# --- a whole state dict ----------------------------------------------------------------------------------------

_ATTN = re.compile(r"^(model\.layers\.\d+\.self_attn\.)(.+)$")


def _check_foldable(cfg, where: str) -> None:
    windows = cfg.window_layers() if hasattr(cfg, "window_layers") else []
    if windows and not cfg.stock_shaped_window_layers():
        full, win = cfg.full_dims(), cfg.layer_dims(windows[0])
        raise FoldError(
            f"{where}: sliding-window layer {windows[0]} has {win.num_heads} heads over {win.num_kv_heads} KV heads of "
            f"width {win.head_dim} (RoPE base {win.rope_theta:g}), the full layers {full.num_heads} / {full.num_kv_heads} "
            f"/ {full.head_dim} ({full.rope_theta:g}): stock Qwen3 has one set of sizes for all layers; refusing to fold")
    if cfg.vha_gated_attention:
        raise FoldError(
            f"{where}: vha_gated_attention=true: {GATE_REASON} (the elementwise gate sits between Postmix and "
            "o_proj), so this model has no exact stock-Qwen3 form; refusing to fold"
        )


def fold_state_dict(state: Mapping[str, np.ndarray], cfg) -> Dict[str, np.ndarray]:
    """Stock-Qwen3 tensors from Qwen3-VHA tensors (HF names and layout); folded ones float64, others as given.

    cfg: a Qwen3VHAConfig. Raises FoldError for gated attention.
    """
    _check_foldable(cfg, "state dict")
    out: Dict[str, np.ndarray] = {}
    for name, value in state.items():
        m = _ATTN.match(name)
        if m is None:
            out[name] = value
            continue
        p, leaf = m.groups()
        if leaf in VHA_ONLY:
            continue
        if leaf == "q_proj.weight":
            out[name] = fold_q_proj(value, state[p + "vha_premix_weight"])
        elif leaf == "q_proj.bias":
            out[name] = fold_q_bias(value, state[p + "vha_premix_weight"])
        elif leaf == "o_proj.weight":
            out[name] = fold_o_proj(value, state[p + "vha_postmix_U"], state[p + "vha_postmix_V"])
        else:
            out[name] = value
    return out


# What a shared-KV model folds into, said in one line by tools/fold.py (docs/fold.md, "Shared KV").
SHARED_KV_NOTE = ("vha_shared_kv: the folded model keeps one shared K = V projection and rotates its attention output "
                  "back (inverse RoPE), so it is Qwen3 shared-KV (model_type qwen3_shared_kv), not stock Qwen3; "
                  "tools/export_onnx.py and paddle_vha serve it")


def folded_model_type(raw: Mapping) -> str:
    """The model_type a Qwen3-VHA config.json folds into: stock qwen3, or qwen3_shared_kv with vha_shared_kv."""
    return Qwen3SharedKVConfig.model_type if raw.get("vha_shared_kv") else Qwen3Config.model_type


def fold_config(raw: Mapping, dtype: Optional[str] = None) -> dict:
    """config.json of the folded model: stock qwen3 (or Qwen3 shared-KV), num_attention_heads = H_v, no vha_* keys."""
    out = {k: v for k, v in raw.items() if not k.startswith("vha_") and k != "auto_map"}
    out["model_type"] = folded_model_type(raw)
    out["architectures"] = ["Qwen3SharedKVForCausalLM" if raw.get("vha_shared_kv") else "Qwen3ForCausalLM"]
    if dtype is not None:
        if "dtype" in raw:
            out["dtype"] = dtype
        if "torch_dtype" in raw or "dtype" not in raw:
            out["torch_dtype"] = dtype
    return out


# --- folder -> folder ------------------------------------------------------------------------------------------

@dataclass
class Entry:
    """One output tensor: how it is made from which input tensors."""

    name: str
    kind: str  # "copy" | "fold_q" | "fold_q_bias" | "fold_o"
    sources: Tuple[str, ...]
    shape: Tuple[int, ...]
    dtype: str  # output safetensors code

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * st.DTYPES[self.dtype].itemsize


@dataclass
class FoldPlan:
    in_dir: str
    out_dir: str
    cfg: Qwen3VHAConfig
    raw_config: dict
    out_config: dict
    out_dtype: str  # code, e.g. "BF16"
    inputs: Dict[str, st.TensorRef]
    entries: List[Entry]
    shards: List[List[Entry]]
    copy_files: List[str]
    skipped: List[str] = field(default_factory=list)
    force: bool = False  # replace an existing OUT_DIR (one this project wrote)

    @property
    def bytes_in(self) -> int:
        return sum(r.nbytes for r in self.inputs.values())

    @property
    def bytes_out(self) -> int:
        return sum(e.nbytes for e in self.entries)


def plan_fold(src, out_dir: str, dtype: str = "auto", force: bool = False, max_shard_size="5GB") -> FoldPlan:
    """Validate the Qwen3-VHA checkpoint `src` (a path or an opened CheckpointFolder) and OUT_DIR from headers alone,
    and describe every output tensor. Reads no tensor data."""
    if dtype not in DTYPE_CHOICES:
        raise FoldError(f"--dtype {dtype!r}: expected one of {', '.join(DTYPE_CHOICES)}")
    ck = CheckpointFolder.open(src)
    in_dir = ck.path
    vha = family(Qwen3VHAConfig.model_type)
    cfg = vha.load_config(ck)  # not qwen3_vha, invalid VHA fields: one line
    _check_foldable(cfg, in_dir)
    vha.check_tensors(ck, cfg)  # tensor names and shapes, from the headers (read once)
    check_output_dir(out_dir, [in_dir], force, FoldError)
    ck.require_float()
    inputs = ck.tensors

    out_code = inputs["model.embed_tokens.weight"].dtype if dtype == "auto" else st.dtype_code(dtype)
    # num_attention_heads = H_v, head_dim = d: the served GQA shapes (the folded family's contract)
    out_shapes = family(folded_model_type(ck.config)).tensor_shapes(cfg)
    entries: List[Entry] = []
    for name in sorted(out_shapes, key=st.natural_key):
        m = _ATTN.match(name)
        p, leaf = m.groups() if m else ("", "")
        if leaf == "q_proj.weight":
            kind, sources = "fold_q", (name, p + "vha_premix_weight")
        elif leaf == "q_proj.bias":
            kind, sources = "fold_q_bias", (name, p + "vha_premix_weight")
        elif leaf == "o_proj.weight":
            kind, sources = "fold_o", (name, p + "vha_postmix_U", p + "vha_postmix_V")
        else:
            kind, sources = "copy", (name,)
            if inputs[name].shape != out_shapes[name]:  # cannot happen after compare_shapes; a cheap invariant
                raise FoldError(f"{in_dir}: {name} shape {list(inputs[name].shape)} != {list(out_shapes[name])}")
        entries.append(Entry(name, kind, sources, tuple(out_shapes[name]), out_code))
    try:
        max_bytes = st.parse_size(max_shard_size)
    except ValueError as e:
        raise FoldError(f"--max-shard-size: {e}") from None
    by_name = {e.name: e for e in entries}
    shards = [[by_name[s[0]] for s in shard]
              for shard in st.plan_shards([(e.name, e.dtype, e.shape) for e in entries], max_bytes)]

    copy_files, skipped = ck.side_files()
    return FoldPlan(in_dir, out_dir, cfg, ck.config, fold_config(ck.config, st.dtype_name(out_code)), out_code, inputs,
                    entries, shards, copy_files, skipped, force)


def format_plan(plan: FoldPlan) -> str:
    """Human-readable plan: tensor groups with shapes in -> out and bytes, files copied, config changes."""
    cfg = plan.cfg
    h_v, h_kv = cfg.num_attention_heads, cfg.num_key_value_heads
    lines = [
        f"fold {plan.in_dir} -> {plan.out_dir}",
        f"  Qwen3-VHA: {cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}, H_v {h_v} virtual / "
        f"H_p {h_v // h_kv} physical query heads (r {cfg.vha_q_head_dim}), H_kv {h_kv}, d {cfg.head_dim}, "
        f"Postmix rank {cfg.vha_postmix_rank}",
        f"  -> {family(plan.out_config['model_type']).label if cfg.vha_shared_kv else 'stock Qwen3'}: "
        f"num_attention_heads {h_v}, num_key_value_heads {h_kv}, head_dim {cfg.head_dim}, "
        f"dtype {st.dtype_name(plan.out_dtype)}",
        "  tensors (name pattern, count, in -> out):",
    ]
    windows = cfg.window_layers()
    if windows:
        win = cfg.layer_dims(windows[0])
        lines.insert(3, f"  sliding-window layers {windows} (window {win.window}, r {win.q_head_dim}, Postmix rank "
                        f"{win.postmix_rank}): kept as Qwen3 sliding_attention layers")
    groups: Dict[Tuple[str, str, tuple], list] = {}
    for e in plan.entries:  # window layers with their own r or R are a group of their own
        key = (re.sub(r"layers\.\d+\.", "layers.{i}.", e.name), e.kind, tuple(plan.inputs[e.sources[0]].shape))
        groups.setdefault(key, []).append(e)
    dropped: Dict[Tuple[str, tuple], list] = {}
    for n, r in plan.inputs.items():
        leaf = n.rsplit(".", 1)[-1]
        if leaf in VHA_ONLY:
            dropped.setdefault((re.sub(r"layers\.\d+\.", "layers.{i}.", n), tuple(r.shape)), []).append(r)
    how = {"copy": "copy", "fold_q": "fold Premix", "fold_q_bias": "fold Premix", "fold_o": "fold Postmix"}
    for (pattern, kind, _), es in groups.items():
        src = plan.inputs[es[0].sources[0]]
        lines.append(
            f"    {pattern:<48} x{len(es):<3} {how[kind]:<12} {list(src.shape)} {st.dtype_name(src.dtype)} -> "
            f"{list(es[0].shape)} {st.dtype_name(es[0].dtype)}  ({fmt_bytes(sum(e.nbytes for e in es), fixed=True)})"
        )
    for (pattern, _), rs in dropped.items():
        lines.append(f"    {pattern:<48} x{len(rs):<3} {'absorbed':<12} {list(rs[0].shape)} -> (none)")
    lines += [
        f"  bytes: {fmt_bytes(plan.bytes_in, fixed=True)} in -> {fmt_bytes(plan.bytes_out, fixed=True)} out, "
        f"{len(plan.shards)} shard(s) + {INDEX_FILE}",
        f"  config.json: model_type {plan.raw_config['model_type']} -> {plan.out_config['model_type']}, architectures -> "
        f"[{plan.out_config['architectures'][0]}], drop {', '.join(sorted(k for k in plan.raw_config if k.startswith('vha_')))}",
        f"  files copied: {', '.join(plan.copy_files) if plan.copy_files else '(none)'}",
    ]
    if plan.skipped:
        lines.append(f"  not copied (folders): {', '.join(plan.skipped)}")
    if cfg.vha_shared_kv:
        lines.append(f"  note: {SHARED_KV_NOTE}")
    return "\n".join(lines)


def _produce(entry: Entry, inputs: Mapping[str, st.TensorRef], chunk_bytes: int):
    """Yield consecutive row blocks of one output tensor, in its output dtype. FoldError naming the tensor for a NaN or
    Inf among its inputs, or a value the output dtype cannot hold."""
    try:
        if entry.kind == "copy":
            ref = inputs[entry.sources[0]]
            for a, b in st.row_chunks(ref, chunk_bytes):
                yield st.cast_finite(st.read_rows(ref, a, b), entry.dtype, entry.name)
            return
        args = [st.cast_finite(st.read_tensor(inputs[s]), inputs[s].dtype, s) for s in entry.sources]  # inputs finite
        fn = {"fold_q": fold_q_proj, "fold_q_bias": fold_q_bias, "fold_o": fold_o_proj}[entry.kind]
        out = fn(*[st.to_float64(a) for a in args])  # float64 math
        del args
        yield st.cast_finite(out, entry.dtype, entry.name)  # one rounding, at the end
    except ValueError as e:  # refused: the output folder is removed (fold_checkpoint writes inside atomic_dir)
        raise FoldError(f"{e}; refusing to fold") from None


def fold_checkpoint(plan: FoldPlan, progress: bool = True, chunk_bytes: int = 8 << 20,
                    on_tensor: Optional[Callable[[Entry], None]] = None) -> str:
    """Write the folded checkpoint described by `plan` to a temporary folder, then rename it to OUT_DIR.

    IN_DIR is only read. An existing OUT_DIR (allowed by plan_fold's force) is replaced only after the new
    folder is complete. Returns OUT_DIR.
    """
    from tqdm import tqdm

    out_dir = os.path.abspath(plan.out_dir)
    entries = {e.name: e for e in plan.entries}

    def chunks(name, code, shape):
        yield from _produce(entries[name], plan.inputs, chunk_bytes)
        if on_tensor is not None:  # runs once the tensor's last rows are written
            on_tensor(entries[name])

    # --force: an existing OUT_DIR is replaced only by a complete new folder (fsutil's output rule)
    with atomic_dir(out_dir, tool="fold", replace=plan.force, error=FoldError) as tmp:
        bar = tqdm(total=plan.bytes_out, unit="B", unit_scale=True, desc="fold", disable=not progress, leave=False)
        shards = [[(e.name, e.dtype, e.shape) for e in shard] for shard in plan.shards]
        write_checkpoint_folder(tmp, shards, chunks, plan.out_config, plan.bytes_out, plan.in_dir, plan.copy_files,
                                on_written=lambda name, nbytes: bar.update(nbytes))
        bar.close()
    return out_dir


# --- verification in Paddle ------------------------------------------------------------------------------------

def _snapshot(path: str):
    return sorted((f, os.stat(os.path.join(path, f)).st_size, os.stat(os.path.join(path, f)).st_mtime_ns)
                  for f in os.listdir(path))


def verify_fold(in_dir: str, out_dir: str, num_sequences: int = 4, seq_len: int = 32, seed: int = 0,
                dtype: str = "float32") -> Dict[str, float]:
    """Load the VHA model (IN_DIR) and stock Qwen3 (OUT_DIR) in Paddle, run random sequences, compare logits.

    Returns max_abs, max_rel (max |diff| / max |logit|) and mean_kl (KL(VHA || folded) per position, nats).
    Neither folder is modified: both load through symlink views in a temporary folder, and the folders'
    listings (names, sizes, mtimes) are checked afterwards.
    """
    import paddle

    from .modeling import Qwen3VHAForCausalLM

    before = (_snapshot(in_dir), _snapshot(out_dir))
    with tempfile.TemporaryDirectory(prefix="vha-verify-") as tmp:
        vha = Qwen3VHAForCausalLM.from_pretrained(linked_view(in_dir, os.path.join(tmp, "in")), dtype=dtype)
        vha.eval()
        vocab = vha.config.vocab_size
        ids = np.random.default_rng(seed).integers(0, vocab, size=(num_sequences, seq_len))
        with paddle.no_grad():
            a = vha(paddle.to_tensor(ids), return_dict=True).logits.astype("float64").numpy()
        del vha
        folded_cls = family_of(out_dir).model_class  # stock Qwen3, or Qwen3 shared-KV
        gqa = folded_cls.from_pretrained(linked_view(out_dir, os.path.join(tmp, "out")), dtype=dtype)
        gqa.eval()
        with paddle.no_grad():
            b = gqa(paddle.to_tensor(ids), return_dict=True).logits.astype("float64").numpy()
        del gqa
    if (_snapshot(in_dir), _snapshot(out_dir)) != before:
        raise RuntimeError(f"verify modified {in_dir} or {out_dir}; this is a bug")
    return compare_logits(a, b)
