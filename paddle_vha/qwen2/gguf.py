"""Qwen2 / Qwen2.5 as llama.cpp's GGUF names it: q / k / v biases always, NeoX (rotate-half) RoPE as Hugging Face's,
so no row permutation."""
from __future__ import annotations

from ..spec.gguf import GGUFForm

__all__ = ["QWEN2_GGUF"]

QWEN2_GGUF = GGUFForm(
    arch="qwen2",
    model_type="qwen2",
    label="Qwen2",
    hf_config="transformers:Qwen2Config",
    architectures=("Qwen2ForCausalLM",),
    tokenizer="qwen2",
    qkv_bias=True,
    config_extra={"use_sliding_window": False},
)
