"""Qwen2 / Qwen2.5 as llama.cpp's GGUF names it: q / k / v biases always, NeoX (rotate-half) RoPE as Hugging Face's,
so no row permutation."""
from __future__ import annotations

from ..spec.gguf import GGUFForm, GGUFPre

__all__ = ["QWEN2_GGUF", "QWEN2_SPLIT"]

# Qwen2's pre-tokenizer split (its tokenizer.json): as Llama 3's, but every digit a piece of its own
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
               r"\s*[\r\n]+|\s+(?!\S)|\s+")

QWEN2_GGUF = GGUFForm(
    arch="qwen2",
    model_type="qwen2",
    label="Qwen2",
    hf_config="transformers:Qwen2Config",
    architectures=("Qwen2ForCausalLM",),
    qkv_bias=True,
    config_extra={"use_sliding_window": False},
    pre_tokenizers=(GGUFPre("qwen2", split=QWEN2_SPLIT, nfc=True),),  # Qwen2, Qwen2.5, Qwen3
)
