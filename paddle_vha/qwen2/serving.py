"""Qwen2 in the exported decoder: the stock GQA form (paddle_vha/qwen3/serving.py), which the layer runs with the q/k/v
biases and without q/k norms its spec declares; onnxruntime-genai's `qwen2` decoder runs the exports."""
from __future__ import annotations

from ..qwen3.serving import Serving

__all__ = ["STOCK_QWEN2"]

STOCK_QWEN2 = Serving(genai_model_type="qwen2")
