"""A base architecture as llama.cpp's GGUF format names it: `GGUFForm` (what each base's own gguf.py declares) and the
tensor names every GGUF of the Llama lineage shares (Llama, Qwen2, Qwen3: one architecture with switches).

Paddle-free and family-free: the forms themselves live in the bases' folders (`qwen3/gguf.py`, ...) and the registry
(`families.gguf_form`) finds one by the file's `general.architecture`; the importer (transform/import_gguf.py) reads
only what a form says.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Dict, Optional, Tuple

__all__ = ["DEFAULT_PRE", "GGUFForm", "GGUFPre", "LAYER_TENSORS", "MODEL_TENSORS", "hf_name", "layer_of"]


@dataclass(frozen=True)
class GGUFForm:
    arch: str  # general.architecture, llama.cpp's name; also the prefix of its hyper-parameter keys ("{arch}.block_count")
    model_type: str  # config.json's model_type of the imported checkpoint
    label: str  # how messages name it: "Llama"
    hf_config: str  # "module:Class" of Hugging Face's config class: the config.json it writes is what HF reads
    architectures: Tuple[str, ...]  # config.json's "architectures": the Hugging Face causal LM class
    # llama.cpp's converter reorders each head's q_proj / k_proj rows for this architecture (its RoPE rotates adjacent
    # pairs, Hugging Face's rotates the two halves): the importer puts them back
    interleaved_rope: bool = False
    qk_norm: bool = False  # per-head q / k RMSNorm tensors (attn_q_norm, attn_k_norm) required
    qkv_bias: Optional[bool] = None  # True: q/k/v biases required; None: optional (config.json's attention_bias says)
    config_extra: Dict[str, object] = field(default_factory=dict)  # fields its config.json always carries
    # the byte-level BPE pre-tokenizers of this base's published tokenizers, by llama.cpp's name (tokenizer.ggml.pre);
    # a GGUF of any architecture may carry any of them
    pre_tokenizers: Tuple["GGUFPre", ...] = ()


@dataclass(frozen=True)
class GGUFPre:
    """A byte-level BPE tokenizer's pre-tokenizer as llama.cpp names it (tokenizer.ggml.pre), in the terms of Hugging
    Face's tokenizer.json: text -> pieces (a Split regex, or GPT-2's own regex) -> byte-level symbols -> BPE."""

    name: str
    split: Optional[str] = None  # a regex whose matches are the pieces (Split, isolated); None: GPT-2's regex
    digits: bool = False  # each digit a piece of its own first (SmolLM's)
    nfc: bool = False  # NFC-normalise the text first (Qwen2's)
    ignore_merges: bool = False  # a piece that is a whole token is taken as it is, without merging (Llama 3's)


DEFAULT_PRE = GGUFPre("default")  # GPT-2's pre-tokenizer: what llama.cpp uses for "default", "gpt2" and unnamed ones


# GGUF tensor name -> Hugging Face name, per decoder layer ({i}) and for the whole model. Optional ones may be absent:
# output.weight (tied embeddings), the biases, the q / k norms (a form says which it requires).
LAYER_TENSORS = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
MODEL_TENSORS = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER = re.compile(r"blk\.(\d+)\.(.+)")


def layer_of(gguf_name: str) -> Optional[int]:
    """The decoder layer a GGUF tensor name belongs to (blk.{i}.*), or None."""
    m = _LAYER.fullmatch(gguf_name)
    return int(m.group(1)) if m else None


def hf_name(gguf_name: str) -> Optional[str]:
    """The Hugging Face name of a GGUF tensor name, or None for a name outside the tables."""
    if gguf_name in MODEL_TENSORS:
        return MODEL_TENSORS[gguf_name]
    m = _LAYER.fullmatch(gguf_name)
    if m and m.group(2) in LAYER_TENSORS:
        return f"model.layers.{int(m.group(1))}.{LAYER_TENSORS[m.group(2)]}"
    return None
