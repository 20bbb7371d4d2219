"""Qwen3 as llama.cpp's GGUF names it: per-head q / k RMSNorm, no biases, NeoX (rotate-half) RoPE as Hugging Face's,
so no row permutation; head_dim may differ from hidden / heads (attention.key_length)."""
from __future__ import annotations

from ..spec.gguf import GGUFForm

__all__ = ["QWEN3_GGUF"]

QWEN3_GGUF = GGUFForm(
    arch="qwen3",
    model_type="qwen3",
    label="Qwen3",
    hf_config="transformers:Qwen3Config",
    architectures=("Qwen3ForCausalLM",),
    qk_norm=True,
    qkv_bias=None,
)
