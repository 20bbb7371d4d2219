"""Qwen3-MoE-VHA's tensors, declared once: Qwen3-VHA's decoder layer (paddle_vha/vha/spec.py: narrow q_proj, Premix,
Postmix, optional shared K = V and gate) with the Qwen3-MoE base's routed-expert MLP on the MoE layers
(paddle_vha/moe/spec.py); dense layers among them are Qwen3-VHA layers as they are."""
from __future__ import annotations

from ..moe.spec import moe_model_spec
from ..vha.spec import VHA_LAYER

__all__ = ["QWEN3_MOE_VHA", "tensor_shapes"]

QWEN3_MOE_VHA = moe_model_spec(VHA_LAYER)
tensor_shapes = QWEN3_MOE_VHA.tensor_shapes  # the on-disk contract: name -> HF-layout shape
