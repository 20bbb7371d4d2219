"""How Qwen3 with sinks is served by the exported decoder (paddle_vha/export/decoder.py): stock GQA layers whose window
layers carry their sink logits into the graph (one more softmax column per query head, no value:
paddle_vha/qwen3/functional.grouped_attention). No onnxruntime-genai decoder type: genai's qwen3 has no sink
(paddle_vha/export/genai.py refuses it naming window_attention_sinks)."""
from __future__ import annotations

from typing import Optional

from ..qwen3.serving import GQAForm
from ..qwen3.serving import export_refusal as stock_refusal
from .spec import SINKS

__all__ = ["SinksForm", "export_form", "cache_shape", "cache_names", "export_refusal"]


class SinksForm(GQAForm):
    """A GQA layer with its sinks (H,) as a graph constant (None on full layers)."""

    def __init__(self, num_kv_heads: int, head_dim: int, sinks=None):
        super().__init__(num_kv_heads, head_dim)
        self.sinks = sinks


def export_form(cfg, layer_idx: int, tensors, const) -> SinksForm:
    name = f"model.layers.{layer_idx}.{SINKS}"
    sinks = const(tensors[name]) if cfg.has_sinks(layer_idx) else None
    return SinksForm(*cache_shape(cfg, layer_idx), sinks=sinks)


def cache_shape(cfg, layer_idx: int) -> tuple:
    return (cfg.num_key_value_heads, cfg.head_dim)


def cache_names(cfg, layer_idx: int) -> tuple:
    return SinksForm.cache_names


def export_refusal(cfg) -> Optional[str]:
    return stock_refusal(cfg)
