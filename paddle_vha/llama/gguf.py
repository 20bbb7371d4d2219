"""Llama as llama.cpp's GGUF names it: no q / k norms, optional attention biases, and the q_proj / k_proj rows of each
head reordered by llama.cpp's converter for its RoPE of adjacent pairs (the importer restores Hugging Face's halves)."""
from __future__ import annotations

from ..spec.gguf import GGUFForm, GGUFPre

__all__ = ["LLAMA_GGUF", "LLAMA3_SPLIT"]

# Llama 3's pre-tokenizer split (its tokenizer.json): contractions, letters with one leading non-letter, up to three
# digits, punctuation runs, newlines, spaces
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                r"\s*[\r\n]+|\s+(?!\S)|\s+")

LLAMA_GGUF = GGUFForm(
    arch="llama",
    model_type="llama",
    label="Llama",
    hf_config="transformers:LlamaConfig",
    architectures=("LlamaForCausalLM",),
    interleaved_rope=True,
    qkv_bias=None,
    config_extra={"mlp_bias": False},
    pre_tokenizers=(GGUFPre("llama-bpe", split=LLAMA3_SPLIT, ignore_merges=True),  # Llama 3.x
                    GGUFPre("smollm", digits=True)),  # SmolLM / SmolLM2: single digits, then GPT-2's regex
)
