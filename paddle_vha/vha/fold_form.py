"""What a Qwen3-VHA checkpoint folds into, as the fold pipeline asks it (paddle_vha/transform/fold.py): which configs
have no exact folded form, the folded model_type and config.json, the one-line notes, the plan's header lines. The
tensors' fold roles are in the spec (paddle_vha/vha/spec.py, paddle_vha/vha/fold_rules.py).

Stock Qwen3 in general; Qwen3 shared-KV with vha_shared_kv (one K = V projection and an inverse RoPE stay); Qwen3
with sinks with window_attention_sinks (docs/fold.md). Registered as the `fold` of the qwen3_vha entry.
"""
from __future__ import annotations

from typing import List, Mapping, Optional

from paddleformers.transformers import Qwen3Config

from ..shared_kv.config import Qwen3SharedKVConfig
from ..sinks.config import Qwen3SinksConfig
from ..spec.fold import FoldForm

__all__ = ["VHAFold", "VHA_FOLD", "GATE_REASON", "SHARED_KV_NOTE", "SINKS_NOTE"]

GATE_REASON = "Postmix cannot cross the sigmoid gate"

# What a shared-KV model folds into, said in one line by tools/fold.py (docs/fold.md, "Shared KV").
SHARED_KV_NOTE = ("vha_shared_kv: the folded model keeps one shared K = V projection and rotates its attention output "
                  "back (inverse RoPE), so it is Qwen3 shared-KV (model_type qwen3_shared_kv), not stock Qwen3; "
                  "tools/export_onnx.py and paddle_vha serve it")

# ... and what a model with attention sinks folds into (docs/fold.md, "Attention sinks").
SINKS_NOTE = ("window_attention_sinks: the folded model keeps the window layers' sink logits (self_attn.sinks, one per "
              "folded head), so it is Qwen3 with sinks (model_type qwen3_sinks), not stock Qwen3: Hugging Face's Qwen3 "
              "and onnxruntime-genai cannot serve it; paddle_vha runs it")


def _has_sinks(raw: Mapping) -> bool:
    windows = raw.get("sliding_window") and "sliding_attention" in (raw.get("layer_types") or [])
    return bool(raw.get("window_attention_sinks")) and bool(windows)


class VHAFold(FoldForm):
    """A VHA family's fold into its base's stock model (`into`, named `label` in messages), over its config object
    (cfg) or its config.json (raw): every vha_* key dropped."""

    drop_prefix = "vha_"

    def __init__(self, into: str, label: str = "Qwen3"):
        super().__init__(into)
        self.label = label

    def refusal(self, cfg) -> Optional[str]:
        """Why `cfg` has no exact folded form (one line, without the path), or None. Reads only the fields it needs,
        so any object with Qwen3-VHA's field names works (fold_state_dict's callers)."""
        windows = cfg.window_layers() if hasattr(cfg, "window_layers") else []
        if windows and not cfg.stock_shaped_window_layers():
            full, win = cfg.full_dims(), cfg.layer_dims(windows[0])
            return (f"sliding-window layer {windows[0]} has {win.num_heads} heads over {win.num_kv_heads} KV heads of "
                    f"width {win.head_dim} (RoPE base {win.rope_theta:g}), the full layers {full.num_heads} / "
                    f"{full.num_kv_heads} / {full.head_dim} ({full.rope_theta:g}): stock {self.label} has one set of "
                    "sizes for all layers")
        if cfg.vha_gated_attention:
            return (f"vha_gated_attention=true: {GATE_REASON} (the elementwise gate sits between Postmix and o_proj), "
                    f"so this model has no exact stock-{self.label} form")
        return None

    def target(self, raw: Mapping) -> str:
        if raw.get("vha_shared_kv"):
            return Qwen3SharedKVConfig.model_type
        return Qwen3SinksConfig.model_type if _has_sinks(raw) else self.into

    def notes(self, cfg, raw: Mapping) -> List[str]:
        """The one-line announcements of a fold whose result is not stock Qwen3."""
        if cfg.vha_shared_kv:
            return [SHARED_KV_NOTE + (" (with its window layers' sinks, window_attention_sinks)" if _has_sinks(raw)
                                      else "")]
        return [SINKS_NOTE] if _has_sinks(raw) else []

    def config(self, raw: Mapping, architecture: str, dtype: Optional[str] = None) -> dict:
        """FoldForm's config.json; window_attention_sinks only where the folded model has sinks."""
        out = super().config(raw, architecture, dtype)
        if not _has_sinks(raw):
            out.pop("window_attention_sinks", None)
        return out

    def header(self, cfg, source: str, target: str, dtype: str) -> List[str]:
        """The plan's header lines: the source's attention sizes, the folded model's, then what else is kept."""
        lines = [
            f"{source}: {cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}, H_v {cfg.num_attention_heads} "
            f"virtual / H_p {cfg.num_physical_heads} physical query heads (r {cfg.vha_q_head_dim}"
            f"{'' if cfg.vha_premix else ', no Premix'}), H_kv {cfg.num_key_value_heads}, d {cfg.head_dim}, "
            f"Postmix rank {cfg.vha_postmix_rank}",
            f"-> {target}: num_attention_heads {cfg.num_attention_heads}, num_key_value_heads "
            f"{cfg.num_key_value_heads}, head_dim {cfg.head_dim}, dtype {dtype}",
            *self.extra_header(cfg),
        ]
        windows = cfg.window_layers()
        if windows:
            win = cfg.layer_dims(windows[0])
            lines.append(f"sliding-window layers {windows} (window {win.window}, r {win.q_head_dim}, Postmix rank "
                         f"{win.postmix_rank}): kept as Qwen3 sliding_attention layers")
        return lines

    def extra_header(self, cfg) -> List[str]:
        return []


VHA_FOLD = VHAFold(Qwen3Config.model_type)
