"""Qwen3 shared-KV's tensors, declared once: stock Qwen3's layer with one `shared_kv_proj` (the keys and the values)
in place of k_proj and v_proj, split or replicated over tensor-parallel ranks as the keys are."""
from __future__ import annotations

from ..qwen3.spec import QWEN3_LAYER, TOP, top_sizes
from ..sinks.spec import sinks_param, sinks_sizes
from ..spec.params import COLUMN, ModelSpec, linear, split_kv

__all__ = ["tensor_shapes", "SHARED_KV_LAYER", "QWEN3_SHARED_KV", "KV_PROJECTIONS"]

KV_PROJECTIONS = ("shared_kv_proj",)  # the Linear (relative to self_attn) that emits the cached heads

SHARED_KV_LAYER = QWEN3_LAYER.replace(
    "qwen3_shared_kv",
    sizes=sinks_sizes,
    drop=("self_attn.k_proj", "self_attn.v_proj"),
    add=(*linear("self_attn.shared_kv_proj", lambda s: s.kv_heads * s.head_dim, lambda s: s.h, split_kv(COLUMN)),
         sinks_param()),  # window layers with window_attention_sinks: one sink logit per query head
)

QWEN3_SHARED_KV = ModelSpec(top=TOP, top_sizes=top_sizes, layer=lambda cfg, i: SHARED_KV_LAYER)

tensor_shapes = QWEN3_SHARED_KV.tensor_shapes  # the on-disk contract: name -> HF-layout shape
