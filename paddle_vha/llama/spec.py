"""Llama's tensors, declared once: Qwen3's decoder layer (paddle_vha/qwen3/spec.py) without the per-head q/k norms;
q/k/v/o biases where attention_bias holds (as Qwen3's). And the variants' tensors over it (VHA, MEA): the variant's
layer built over this one, so they too have no q/k norm. Pure Python."""
from __future__ import annotations

from ..mea.spec import mea_layers, mea_model_spec
from ..qwen3.spec import QWEN3, QWEN3_LAYER
from ..spec.params import ModelSpec
from ..vha.spec import vha_layer, vha_model_spec

__all__ = ["LLAMA_LAYER", "LLAMA", "LLAMA_VHA_LAYER", "LLAMA_VHA", "LLAMA_MEA_LAYER", "LLAMA_MEA_STOCK_LAYER",
           "LLAMA_MEA", "QK_NORMS"]

QK_NORMS = ("self_attn.q_norm.weight", "self_attn.k_norm.weight")  # what Qwen3 adds to Llama's attention

LLAMA_LAYER = QWEN3_LAYER.replace("llama", drop=QK_NORMS)
LLAMA = ModelSpec(top=QWEN3.top, top_sizes=QWEN3.top_sizes, layer=lambda cfg, i: LLAMA_LAYER)
LLAMA_VHA_LAYER = vha_layer(LLAMA_LAYER)
LLAMA_VHA = vha_model_spec(LLAMA, LLAMA_VHA_LAYER)
LLAMA_MEA_LAYER, LLAMA_MEA_STOCK_LAYER = mea_layers(LLAMA_LAYER)
LLAMA_MEA = mea_model_spec(LLAMA, LLAMA_MEA_LAYER, LLAMA_MEA_STOCK_LAYER)
