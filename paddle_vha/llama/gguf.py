"""Llama as llama.cpp's GGUF names it: no q / k norms, optional attention biases, and the q_proj / k_proj rows of each
head reordered by llama.cpp's converter for its RoPE of adjacent pairs (the importer restores Hugging Face's halves)."""
from __future__ import annotations

from ..spec.gguf import GGUFForm

__all__ = ["LLAMA_GGUF"]

LLAMA_GGUF = GGUFForm(
    arch="llama",
    model_type="llama",
    label="Llama",
    hf_config="transformers:LlamaConfig",
    architectures=("LlamaForCausalLM",),
    tokenizer="llama",
    interleaved_rope=True,
    qkv_bias=None,
    config_extra={"mlp_bias": False},
)
