"""Fold a Qwen3-VHA checkpoint into a stock Qwen3 GQA checkpoint (exact, float64, streaming): a generic walk over the
source family's spec.

Each tensor fold absorbs names its fold role in the spec (`Param(fold=FoldRule)`, paddle_vha/spec/fold.py): Qwen3-VHA's
Premix goes into q_proj, Postmix U, V into o_proj (the math: paddle_vha/vha/fold_rules.py). Every other tensor of the
folded family's contract is copied. What the checkpoint folds into (the folded model_type and config.json, the
refusals, the notes, the plan's header) is the source family's fold form (`Family.fold_form`:
paddle_vha/vha/fold_form.py, paddle_vha/moe_vha/fold_form.py). Nothing here names a tensor or a family's config.

Three levels of API, each used by the next:
    fold_q_proj / fold_q_bias / fold_o_proj    one layer's tensors (float64 numpy; VHA's rule functions)
    fold_state_dict(state, cfg)                a whole in-memory state dict
    plan_fold(src, ...) + fold_checkpoint      folder -> folder, tensor by tensor (what tools/fold.py runs); src is a
                                               path or an opened paddle_vha.checkpoint.CheckpointFolder

`fold_checkpoint` holds at most one folded attention tensor's inputs and output in float64 plus one
`chunk_bytes` block of a copied tensor, whatever the model size: inputs are read with pread row ranges
(never the whole shard), outputs stream into shards whose headers are written first.
"""
from __future__ import annotations

from typing import Callable, Dict, Mapping, Optional

import numpy as np

from ..checkpoint import safetensors_io as st
from ..checkpoint.contract import INDEX_FILE, CheckpointError
from ..checkpoint.folder import CheckpointFolder
from ..evaluate import compare_logits
from ..families import FAMILIES, Family, family, family_of
from ..spec.fold import FoldStep, model_fold
from ..transform import Description, Entry, Table, TransformPlan, check_dtype, layer_pattern, output_code, write_plan
from ..transform.describe import files_line, group, skipped_lines
from ..transform.plan import open_output
from ..transform.verify import folder_logits, left_unchanged, model_logits, random_tokens
from ..units import fmt_bytes
from ..vha.config import Qwen3VHAConfig
from ..vha.fold_rules import fold_o_proj, fold_q_bias, fold_q_proj  # re-exported: the per-layer API

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


class FoldError(CheckpointError):
    """A checkpoint (or output location) fold refuses; the message is one line naming the problem."""


def _source(model_type) -> Family:
    """The folded family of `model_type`; any other (or none) is read as Qwen3-VHA's, whose config check says why."""
    fam = FAMILIES.get(model_type)
    return fam if fam is not None and fam.fold_form is not None else family(Qwen3VHAConfig.model_type)


def _check_foldable(cfg, where: str) -> None:
    why = _source(getattr(cfg, "model_type", None)).fold_form.refusal(cfg)
    if why:
        raise FoldError(f"{where}: {why}; refusing to fold")


# --- a whole state dict ----------------------------------------------------------------------------------------

def fold_state_dict(state: Mapping[str, np.ndarray], cfg) -> Dict[str, np.ndarray]:
    """Stock-Qwen3 tensors from Qwen3-VHA tensors (HF names and layout); folded ones float64, others as given.

    cfg: a Qwen3VHAConfig (or Qwen3MoeVHAConfig). Raises FoldError for gated attention.
    """
    _check_foldable(cfg, "state dict")
    steps, absorbed = model_fold(_source(cfg.model_type).spec, cfg)
    absorbed = set(absorbed)
    return {name: steps[name].apply(state.__getitem__) if name in steps else value
            for name, value in state.items() if name not in absorbed}


def folded_model_type(raw: Mapping) -> str:
    """The model_type a config.json folds into (its family's fold form: stock qwen3, qwen3_shared_kv with
    vha_shared_kv, qwen3_sinks with window_attention_sinks; stock qwen3_moe from Qwen3-MoE-VHA)."""
    return _source(raw.get("model_type")).fold_form.target(raw)


def fold_config(raw: Mapping, dtype: Optional[str] = None) -> dict:
    """config.json of the folded model: stock qwen3 (or Qwen3 shared-KV, Qwen3 with sinks, stock qwen3_moe),
    num_attention_heads = H_v, no vha_* keys (window_attention_sinks only where the folded model has sinks)."""
    return _source(raw.get("model_type")).fold_form.config(raw, family(folded_model_type(raw)).causal_lm_name, dtype)


# --- folder -> folder ------------------------------------------------------------------------------------------

class FoldPlan(TransformPlan):
    """plan_fold's plan: the stock-Qwen3 (or Qwen3 shared-KV) tensors of a Qwen3-VHA checkpoint (cfg, its config)."""

    tool = verb = "fold"
    error = FoldError

    @property
    def verify_numpy(self) -> bool:
        """Whether --verify runs the float64 numpy forward (a MoE fold: no Paddle model) instead of Paddle."""
        return self.source_family.fold_form.verify_numpy

    @property
    def verify_how(self) -> str:
        """What --verify runs: both models in Paddle, or (a MoE fold, no Paddle model) both checkpoints in numpy."""
        if self.verify_numpy:
            return "float64 numpy forward of both checkpoints, MoE-VHA vs folded"
        return "Paddle float32, VHA vs folded"

    def describe(self) -> Description:
        out, target = self.out_config, self.target
        header = self.source_family.fold_form.header(self.cfg, self.source_family.label,
                                              ("stock " if target.stock else "") + target.label,
                                              st.dtype_name(self.out_code))
        dropped = self.source_family.fold_form.dropped(self.in_config)
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
        absorbed tensors."""
        rows = []
        groups = group(self.entries, lambda e: (layer_pattern(e.name), e.how, tuple(self.inputs[e.sources[0]].shape)))
        for (pattern, how, _), es in groups.items():
            src = self.inputs[es[0].sources[0]]
            rows.append((pattern, f"x{len(es)}", how,
                         f"{list(src.shape)} {st.dtype_name(src.dtype)} -> {list(es[0].shape)} "
                         f"{st.dtype_name(es[0].code)}  ({fmt_bytes(sum(e.nbytes for e in es), fixed=True)})"))
        absorbed = set(model_fold(self.source_family.spec, self.cfg)[1])
        absorbed = [(n, r) for n, r in self.inputs.items() if n in absorbed]
        for (pattern, shape), rs in group(absorbed, lambda nr: (layer_pattern(nr[0]), tuple(nr[1].shape))).items():
            rows.append((pattern, f"x{len(rs)}", "absorbed", f"{list(shape)} -> (none)"))
        return Table("tensors (name pattern, count, in -> out):", (48, 4, 12), rows)


def _entry(ck: CheckpointFolder, name: str, shape, code: str, step: Optional[FoldStep]) -> Entry:
    """How output tensor `name` is made: by its fold step (how = the rule's label), else copied."""
    if step is not None:
        return Entry(name, tuple(shape), code, step.rule.label, step.sources)
    if ck.tensors[name].shape != tuple(shape):  # cannot happen after check_tensors; a cheap invariant
        raise FoldError(f"{ck.path}: {name} shape {list(ck.tensors[name].shape)} != {list(shape)}")
    return Entry(name, tuple(shape), code, "copy", (name,))


def plan_fold(src, out_dir: str, dtype: str = "auto", force: bool = False, max_shard_size="5GB") -> FoldPlan:
    """Validate the Qwen3-VHA checkpoint `src` (a path or an opened CheckpointFolder) and OUT_DIR from headers alone,
    and describe every output tensor. Reads no tensor data."""
    check_dtype(dtype, FoldError)
    ck = CheckpointFolder.open(src)
    source = _source(ck.model_type)  # Qwen3-VHA, or Qwen3-MoE-VHA (folds into stock Qwen3-MoE)
    cfg = source.load_config(ck)  # not a folded family, invalid VHA fields: one line
    _check_foldable(cfg, ck.path)
    source.check_tensors(ck, cfg)  # tensor names and shapes, from the headers (read once)
    open_output(ck, out_dir, force, FoldError)
    code = output_code(dtype, ck.tensors)
    # num_attention_heads = H_v, head_dim = d: the served GQA shapes (the folded family's contract)
    target = family(folded_model_type(ck.config))
    out_shapes = target.tensor_shapes(cfg)
    steps, _ = model_fold(source.spec, cfg)
    return FoldPlan.build(ck, out_dir, [_entry(ck, n, s, code, steps.get(n)) for n, s in out_shapes.items()],
                          max_shard_size, cfg=cfg, out_config=fold_config(ck.config, st.dtype_name(code)),
                          out_code=code, force=force, notes=source.fold_form.notes(cfg, ck.config),
                          source_family=source, target=target)


def fold_checkpoint(plan: FoldPlan, progress: bool = True, chunk_bytes: int = 8 << 20,
                    on_tensor: Optional[Callable[[Entry], None]] = None) -> str:
    """Write the folded checkpoint described by `plan` to a temporary folder, then rename it to OUT_DIR.

    IN_DIR is only read. An existing OUT_DIR (allowed by plan_fold's force) is replaced only after the new
    folder is complete. Returns OUT_DIR. A NaN or Inf among a tensor's inputs, or a value the output dtype cannot
    hold, is a FoldError naming the tensor (nothing written).
    """
    steps, _ = model_fold(plan.source_family.spec, plan.cfg)

    def make(entry: Entry) -> np.ndarray:  # float64 math on finite inputs; one rounding, at the write
        return steps[entry.name].apply(plan.read_float64)

    return write_plan(plan, make, progress, chunk_bytes, on_tensor)


# --- verification in Paddle ------------------------------------------------------------------------------------

def verify_fold(in_dir: str, out_dir: str, num_sequences: int = 4, seq_len: int = 32, seed: int = 0,
                dtype: str = "float32") -> Dict[str, float]:
    """Load the VHA model (IN_DIR) and stock Qwen3 (OUT_DIR) in Paddle, run random sequences, compare logits.

    Returns max_abs, max_rel (max |diff| / max |logit|) and mean_kl (KL(VHA || folded) per position, nats).
    Neither folder is modified: both load through symlink views in a temporary folder, and the folders'
    listings (names, sizes, mtimes) are checked afterwards.
    """
    source = family_of(in_dir)
    if not source.has_model:  # Qwen3-MoE-VHA: no Paddle model; both sides in float64 numpy
        return verify_fold_numpy(in_dir, out_dir, num_sequences, seq_len, seed)
    with left_unchanged(in_dir, out_dir):
        ids = random_tokens(CheckpointFolder.open(in_dir).config["vocab_size"], num_sequences, seq_len, seed)
        a = model_logits(in_dir, [ids], source.model_class, dtype)
        b = model_logits(out_dir, [ids], family_of(out_dir).model_class, dtype)  # stock Qwen3, or Qwen3 shared-KV
    return compare_logits(a, b)


def verify_fold_numpy(in_dir: str, out_dir: str, num_sequences: int = 4, seq_len: int = 32,
                      seed: int = 0) -> Dict[str, float]:
    """--verify of a MoE fold: the unfolded (IN_DIR) and folded (OUT_DIR) checkpoints through the same float64 numpy
    forward (router softmax, top-k, renormalisation, SwiGLU experts), on random tokens; compare_logits of the two."""
    with left_unchanged(in_dir, out_dir):
        ids = random_tokens(CheckpointFolder.open(in_dir).config["vocab_size"], num_sequences, seq_len, seed)
        return compare_logits(folder_logits(in_dir, ids), folder_logits(out_dir, ids))
