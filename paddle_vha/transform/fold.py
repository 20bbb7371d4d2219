"""Fold a Qwen3-VHA checkpoint into a stock Qwen3 GQA checkpoint (exact, float64, streaming).

The math (docs/method.md, "Why it folds"), in on-disk layout (Linear weights [out, in]):

    q_proj:  W_Q [H_p*r, h] and Premix P [H_kv, r, d]  ->  W_Q' [H_v*d, h]
             block j = g*H_p + i of W_Q' is P[g]^T W_Q^(i)       (Q_v[j] = x W_Q^(i)T P[g]);  b_q'[j] = b_q^(i) P[g]
    o_proj:  W_O [h, H_v*d], M = I + V U^T [H_v, H_v]       ->  W_O' [h, H_v*d]
             input block k of W_O' is sum_j M[j, k] W_O[:, j]   (W_O' = W_O (M (x) I_d))
    everything else is copied; vha_premix_weight / vha_postmix_U / vha_postmix_V disappear.
    Without Premix (vha_premix=false) q_proj is already [H_v*d, h] and is copied; only o_proj changes.

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

import re
from typing import Callable, Dict, Mapping, Optional

import numpy as np

from paddleformers.transformers import Qwen3Config

from ..checkpoint import safetensors_io as st
from ..checkpoint.contract import INDEX_FILE, CheckpointError
from ..checkpoint.folder import CheckpointFolder
from ..evaluate import compare_logits
from ..families import family, family_of
from ..moe.config import Qwen3MoeConfig
from ..moe_vha.config import Qwen3MoeVHAConfig, fold_refusal
from ..shared_kv.config import Qwen3SharedKVConfig
from ..sinks.config import Qwen3SinksConfig
from ..transform import Description, Entry, Table, TransformPlan, check_dtype, layer_pattern, output_code, write_plan
from ..transform.describe import files_line, group, skipped_lines
from ..transform.plan import open_output
from ..transform.verify import folder_logits, left_unchanged, model_logits, random_tokens
from ..units import fmt_bytes
from ..vha.config import Qwen3VHAConfig
from ..vha.spec import VHA_ONLY

__all__ = [
    "FoldError",
    "FoldPlan",
    "fold_checkpoint",
    "fold_config",
    "fold_o_proj",
    "fold_q_bias",
    "fold_q_proj",
    "fold_state_dict",
    "plan_fold",
    "verify_fold",
    "DEFAULT_VERIFY_TOL",
]

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
    why = fold_refusal(cfg) if isinstance(cfg, Qwen3MoeVHAConfig) else None  # what stock Qwen3-MoE cannot hold
    if why:
        raise FoldError(f"{where}: {why}; refusing to fold")
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
        if leaf.startswith("q_proj.") and p + "vha_premix_weight" not in state:  # no Premix: already stock
            out[name] = value
        elif leaf == "q_proj.weight":
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


# ... and what a model with attention sinks folds into (docs/fold.md, "Attention sinks").
SINKS_NOTE = ("window_attention_sinks: the folded model keeps the window layers' sink logits (self_attn.sinks, one per "
              "folded head), so it is Qwen3 with sinks (model_type qwen3_sinks), not stock Qwen3: Hugging Face's Qwen3 "
              "and onnxruntime-genai cannot serve it; paddle_vha runs it")


def _fold_notes(cfg, raw: Mapping) -> list:
    """The one-line announcements of a fold whose result is not stock Qwen3."""
    if cfg.vha_shared_kv:
        return [SHARED_KV_NOTE + (" (with its window layers' sinks, window_attention_sinks)" if _has_sinks(raw) else "")]
    return [SINKS_NOTE] if _has_sinks(raw) else []


def _has_sinks(raw: Mapping) -> bool:
    windows = raw.get("sliding_window") and "sliding_attention" in (raw.get("layer_types") or [])
    return bool(raw.get("window_attention_sinks")) and bool(windows)


def folded_model_type(raw: Mapping) -> str:
    """The model_type a Qwen3-VHA config.json folds into: stock qwen3, qwen3_shared_kv with vha_shared_kv, or
    qwen3_sinks with window_attention_sinks; a Qwen3-MoE-VHA one folds into stock qwen3_moe."""
    if raw.get("model_type") == Qwen3MoeVHAConfig.model_type:
        return Qwen3MoeConfig.model_type
    if raw.get("vha_shared_kv"):
        return Qwen3SharedKVConfig.model_type
    return Qwen3SinksConfig.model_type if _has_sinks(raw) else Qwen3Config.model_type


# The causal LM class each folded model_type names in config.json's architectures (what Hugging Face loads).
_ARCHITECTURES = {Qwen3Config.model_type: "Qwen3ForCausalLM", Qwen3SharedKVConfig.model_type: "Qwen3SharedKVForCausalLM",
                  Qwen3SinksConfig.model_type: Qwen3SinksConfig.causal_lm_name,
                  Qwen3MoeConfig.model_type: "Qwen3MoeForCausalLM"}
_STOCK = (Qwen3Config.model_type, Qwen3MoeConfig.model_type)  # folds that are stock models (the plan's header says so)
# Keys of a Qwen3-MoE-VHA config.json that stock Qwen3-MoE does not have (a shared expert is refused before this).
_MOE_ONLY = ("moe_shared_expert_intermediate_size", "moe_shared_expert_gate")


def fold_config(raw: Mapping, dtype: Optional[str] = None) -> dict:
    """config.json of the folded model: stock qwen3 (or Qwen3 shared-KV, Qwen3 with sinks, stock qwen3_moe),
    num_attention_heads = H_v, no vha_* keys (window_attention_sinks only where the folded model has sinks)."""
    out = {k: v for k, v in raw.items() if not k.startswith("vha_") and k not in ("auto_map", *_MOE_ONLY)}
    if not _has_sinks(raw):
        out.pop("window_attention_sinks", None)
    out["model_type"] = folded_model_type(raw)
    out["architectures"] = [_ARCHITECTURES[out["model_type"]]]
    if dtype is not None:
        if "dtype" in raw:
            out["dtype"] = dtype
        if "torch_dtype" in raw or "dtype" not in raw:
            out["torch_dtype"] = dtype
    return out


# --- folder -> folder ------------------------------------------------------------------------------------------

_FOLDS = {"fold_q": fold_q_proj, "fold_q_bias": fold_q_bias, "fold_o": fold_o_proj}
_HOW = {"copy": "copy", "fold_q": "fold Premix", "fold_q_bias": "fold Premix", "fold_o": "fold Postmix"}


class FoldPlan(TransformPlan):
    """plan_fold's plan: the stock-Qwen3 (or Qwen3 shared-KV) tensors of a Qwen3-VHA checkpoint (cfg, its config)."""

    tool = verb = "fold"
    error = FoldError

    @property
    def verify_numpy(self) -> bool:
        """Whether --verify runs the float64 numpy forward (a MoE fold: no Paddle model) instead of Paddle."""
        return isinstance(self.cfg, Qwen3MoeVHAConfig)

    @property
    def verify_how(self) -> str:
        """What --verify runs: both models in Paddle, or (a MoE fold, no Paddle model) both checkpoints in numpy."""
        if self.verify_numpy:
            return "float64 numpy forward of both checkpoints, MoE-VHA vs folded"
        return "Paddle float32, VHA vs folded"

    def describe(self) -> Description:
        cfg, out = self.cfg, self.out_config
        h_v, h_kv = cfg.num_attention_heads, cfg.num_key_value_heads
        source, target = family(self.in_config["model_type"]).label, family(out["model_type"]).label
        header = [
            f"{source}: {cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}, H_v {h_v} virtual / "
            f"H_p {cfg.num_physical_heads} physical query heads (r {cfg.vha_q_head_dim}"
            f"{'' if cfg.vha_premix else ', no Premix'}), H_kv {h_kv}, d {cfg.head_dim}, "
            f"Postmix rank {cfg.vha_postmix_rank}",
            f"-> {'stock ' + target if out['model_type'] in _STOCK else target}: "
            f"num_attention_heads {h_v}, num_key_value_heads {h_kv}, head_dim {cfg.head_dim}, "
            f"dtype {st.dtype_name(self.out_code)}",
        ]
        if isinstance(cfg, Qwen3MoeVHAConfig):
            header.append(f"routed experts: {cfg.num_experts} per MoE layer, top-{cfg.num_experts_per_tok}, width "
                          f"{cfg.moe_intermediate_size}, norm_topk_prob {cfg.norm_topk_prob}; MoE layers "
                          f"{cfg.moe_layer_indices}: router and experts copied")
        windows = cfg.window_layers()
        if windows:
            win = cfg.layer_dims(windows[0])
            header.append(f"sliding-window layers {windows} (window {win.window}, r {win.q_head_dim}, Postmix rank "
                          f"{win.postmix_rank}): kept as Qwen3 sliding_attention layers")
        dropped = sorted(k for k in self.in_config if k.startswith("vha_"))
        footer = [
            f"bytes: {fmt_bytes(self.bytes_in, fixed=True)} in -> {fmt_bytes(self.bytes_out, fixed=True)} out, "
            f"{len(self.shards)} shard(s) + {INDEX_FILE}",
            f"config.json: model_type {self.in_config['model_type']} -> {out['model_type']}, architectures -> "
            f"[{out['architectures'][0]}], drop {', '.join(dropped)}",
            files_line(self), *skipped_lines(self),
        ]
        return Description(f"fold {self.in_dir} -> {self.out_dir}", header, self._table(), footer, self.notes)

    def _table(self) -> Table:
        """One row per tensor group (window layers with their own r or R are a group of their own), then the
        absorbed VHA-only tensors."""
        rows = []
        groups = group(self.entries, lambda e: (layer_pattern(e.name), e.how, tuple(self.inputs[e.sources[0]].shape)))
        for (pattern, how, _), es in groups.items():
            src = self.inputs[es[0].sources[0]]
            rows.append((pattern, f"x{len(es)}", _HOW[how],
                         f"{list(src.shape)} {st.dtype_name(src.dtype)} -> {list(es[0].shape)} "
                         f"{st.dtype_name(es[0].code)}  ({fmt_bytes(sum(e.nbytes for e in es), fixed=True)})"))
        absorbed = [(n, r) for n, r in self.inputs.items() if n.rsplit(".", 1)[-1] in VHA_ONLY]
        for (pattern, shape), rs in group(absorbed, lambda nr: (layer_pattern(nr[0]), tuple(nr[1].shape))).items():
            rows.append((pattern, f"x{len(rs)}", "absorbed", f"{list(shape)} -> (none)"))
        return Table("tensors (name pattern, count, in -> out):", (48, 4, 12), rows)


def _entry(ck: CheckpointFolder, name: str, shape, code: str) -> Entry:
    """How output tensor `name` is made: q_proj (+ bias) with Premix, o_proj with Postmix, anything else copied."""
    m = _ATTN.match(name)
    p, leaf = m.groups() if m else ("", "")
    if leaf.startswith("q_proj.") and p + "vha_premix_weight" not in ck.tensors:  # no Premix: q_proj is stock
        leaf = "copied"
    if leaf == "q_proj.weight":
        return Entry(name, tuple(shape), code, "fold_q", (name, p + "vha_premix_weight"))
    if leaf == "q_proj.bias":
        return Entry(name, tuple(shape), code, "fold_q_bias", (name, p + "vha_premix_weight"))
    if leaf == "o_proj.weight":
        return Entry(name, tuple(shape), code, "fold_o", (name, p + "vha_postmix_U", p + "vha_postmix_V"))
    if ck.tensors[name].shape != tuple(shape):  # cannot happen after check_tensors; a cheap invariant
        raise FoldError(f"{ck.path}: {name} shape {list(ck.tensors[name].shape)} != {list(shape)}")
    return Entry(name, tuple(shape), code, "copy", (name,))


def plan_fold(src, out_dir: str, dtype: str = "auto", force: bool = False, max_shard_size="5GB") -> FoldPlan:
    """Validate the Qwen3-VHA checkpoint `src` (a path or an opened CheckpointFolder) and OUT_DIR from headers alone,
    and describe every output tensor. Reads no tensor data."""
    check_dtype(dtype, FoldError)
    ck = CheckpointFolder.open(src)
    moe = ck.model_type == Qwen3MoeVHAConfig.model_type  # Qwen3-MoE-VHA folds into stock Qwen3-MoE
    vha = family(Qwen3MoeVHAConfig.model_type if moe else Qwen3VHAConfig.model_type)
    cfg = vha.load_config(ck)  # not qwen3_vha, invalid VHA fields: one line
    _check_foldable(cfg, ck.path)
    vha.check_tensors(ck, cfg)  # tensor names and shapes, from the headers (read once)
    open_output(ck, out_dir, force, FoldError)
    code = output_code(dtype, ck.tensors)
    # num_attention_heads = H_v, head_dim = d: the served GQA shapes (the folded family's contract)
    out_shapes = family(folded_model_type(ck.config)).tensor_shapes(cfg)
    return FoldPlan.build(ck, out_dir, [_entry(ck, n, s, code) for n, s in out_shapes.items()], max_shard_size,
                          cfg=cfg, out_config=fold_config(ck.config, st.dtype_name(code)), out_code=code, force=force,
                          notes=_fold_notes(cfg, ck.config))


def fold_checkpoint(plan: FoldPlan, progress: bool = True, chunk_bytes: int = 8 << 20,
                    on_tensor: Optional[Callable[[Entry], None]] = None) -> str:
    """Write the folded checkpoint described by `plan` to a temporary folder, then rename it to OUT_DIR.

    IN_DIR is only read. An existing OUT_DIR (allowed by plan_fold's force) is replaced only after the new
    folder is complete. Returns OUT_DIR. A NaN or Inf among a tensor's inputs, or a value the output dtype cannot
    hold, is a FoldError naming the tensor (nothing written).
    """
    def make(entry: Entry) -> np.ndarray:  # float64 math on finite inputs; one rounding, at the write
        return _FOLDS[entry.how](*[plan.read_float64(s) for s in entry.sources])

    return write_plan(plan, make, progress, chunk_bytes, on_tensor)


# --- verification in Paddle ------------------------------------------------------------------------------------

def verify_fold(in_dir: str, out_dir: str, num_sequences: int = 4, seq_len: int = 32, seed: int = 0,
                dtype: str = "float32") -> Dict[str, float]:
    """Load the VHA model (IN_DIR) and stock Qwen3 (OUT_DIR) in Paddle, run random sequences, compare logits.

    Returns max_abs, max_rel (max |diff| / max |logit|) and mean_kl (KL(VHA || folded) per position, nats).
    Neither folder is modified: both load through symlink views in a temporary folder, and the folders'
    listings (names, sizes, mtimes) are checked afterwards.
    """
    if not family_of(in_dir).has_model:  # Qwen3-MoE-VHA: no Paddle model; both sides in float64 numpy
        return verify_fold_numpy(in_dir, out_dir, num_sequences, seq_len, seed)
    from ..vha.modeling import Qwen3VHAForCausalLM

    with left_unchanged(in_dir, out_dir):
        ids = random_tokens(CheckpointFolder.open(in_dir).config["vocab_size"], num_sequences, seq_len, seed)
        a = model_logits(in_dir, [ids], Qwen3VHAForCausalLM, dtype)
        b = model_logits(out_dir, [ids], family_of(out_dir).model_class, dtype)  # stock Qwen3, or Qwen3 shared-KV
    return compare_logits(a, b)


def verify_fold_numpy(in_dir: str, out_dir: str, num_sequences: int = 4, seq_len: int = 32,
                      seed: int = 0) -> Dict[str, float]:
    """--verify of a MoE fold: the unfolded (IN_DIR) and folded (OUT_DIR) checkpoints through the same float64 numpy
    forward (router softmax, top-k, renormalisation, SwiGLU experts), on random tokens; compare_logits of the two."""
    with left_unchanged(in_dir, out_dir):
        ids = random_tokens(CheckpointFolder.open(in_dir).config["vocab_size"], num_sequences, seq_len, seed)
        return compare_logits(folder_logits(in_dir, ids), folder_logits(out_dir, ids))
