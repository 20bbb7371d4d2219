"""Llama in the exported decoder: the stock GQA form (paddle_vha/qwen3/serving.py), which the layer runs without q/k
norms because its spec declares none; onnxruntime-genai's `llama` decoder runs the exports."""
from __future__ import annotations

from ..qwen3.serving import Serving

__all__ = ["STOCK_LLAMA"]

STOCK_LLAMA = Serving(genai_model_type="llama")
