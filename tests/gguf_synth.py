"""Synthetic GGUF files for the importer's tests, written with the `gguf` package's writer; the quantized blocks are
built here from the GGUF block layouts (Q8_0, Q4_0, Q4_1: llama.cpp's ggml-common.h structs, restated below) with a
float64 dequantization of the same blocks as the oracle. Imports nothing from paddle_vha.

Block layouts (32 weights a block, little-endian):
    Q8_0  fp16 d, int8 q[32]                                 w = d * q
    Q4_0  fp16 d, uint8 qs[16]: q[j] = qs[j] & 15, q[j+16] = qs[j] >> 4    w = d * (q - 8)
    Q4_1  fp16 d, fp16 m, uint8 qs[16] (as Q4_0)             w = d * q + m
    Q5_0  fp16 d, uint32 qh, uint8 qs[16]: the low 4 bits as Q4_0, bit 4 of q[j] is bit j of qh    w = d * (q - 16)
    Q5_1  fp16 d, fp16 m, uint32 qh, uint8 qs[16] (as Q5_0)  w = d * q + m

Tensor names and metadata keys are llama.cpp's (general.architecture, {arch}.block_count, blk.{i}.attn_q.weight, ...);
the model's ground truth is kept in Hugging Face names and row order; for the llama architecture the GGUF gets
llama.cpp's reordering of each head's q / k rows (GGUF row h*d + 2j + t = Hugging Face row h*d + t*d/2 + j).
"""
from __future__ import annotations

from typing import Dict, Optional, Sequence

import numpy as np

BLOCK = 32


def _blocks(x: np.ndarray) -> np.ndarray:
    assert x.shape[-1] % BLOCK == 0, x.shape
    return x.reshape(x.shape[0], -1, BLOCK).astype(np.float64)  # (rows, blocks, 32)


def _nibbles(q: np.ndarray) -> np.ndarray:
    """(rows, blocks, 32) integers 0..15 -> (rows, blocks, 16) bytes: low nibble q[j], high nibble q[j + 16]."""
    return (q[..., :16] | (q[..., 16:] << 4)).astype(np.uint8)


def quantize(x: np.ndarray, qtype: str):
    """(raw bytes (rows, bytes per row) uint8, dequantized float64 (rows, cols)) of a 2-D float matrix."""
    b = _blocks(x)
    rows = x.shape[0]
    if qtype == "Q8_0":
        d = (np.abs(b).max(-1, keepdims=True) / 127).astype(np.float16)
        q = np.clip(np.rint(b / np.where(d == 0, 1, d)), -127, 127).astype(np.int8)
        raw = np.concatenate([d.view(np.uint8), q.view(np.uint8)], -1)
        deq = d.astype(np.float64) * q
    elif qtype == "Q4_0":
        d = (np.abs(b).max(-1, keepdims=True) / 7).astype(np.float16)
        q = np.clip(np.rint(b / np.where(d == 0, 1, d)) + 8, 0, 15).astype(np.int64)
        raw = np.concatenate([d.view(np.uint8), _nibbles(q)], -1)
        deq = d.astype(np.float64) * (q - 8)
    elif qtype == "Q4_1":
        lo, hi = b.min(-1, keepdims=True), b.max(-1, keepdims=True)
        d, m = ((hi - lo) / 15).astype(np.float16), lo.astype(np.float16)
        q = np.clip(np.rint((b - m) / np.where(d == 0, 1, d)), 0, 15).astype(np.int64)
        raw = np.concatenate([d.view(np.uint8), m.view(np.uint8), _nibbles(q)], -1)
        deq = d.astype(np.float64) * q + m.astype(np.float64)
    elif qtype in ("Q5_0", "Q5_1"):
        if qtype == "Q5_0":
            d = (np.abs(b).max(-1, keepdims=True) / 15).astype(np.float16)
            q = np.clip(np.rint(b / np.where(d == 0, 1, d)) + 16, 0, 31).astype(np.int64)
            head, deq = [d], d.astype(np.float64) * (q - 16)
        else:
            lo, hi = b.min(-1, keepdims=True), b.max(-1, keepdims=True)
            d, m = ((hi - lo) / 31).astype(np.float16), lo.astype(np.float16)
            q = np.clip(np.rint((b - m) / np.where(d == 0, 1, d)), 0, 31).astype(np.int64)
            head, deq = [d, m], d.astype(np.float64) * q + m.astype(np.float64)
        qh = ((q >> 4) << np.arange(32)).sum(-1, keepdims=True).astype("<u4")  # bit j: the 5th bit of q[j]
        raw = np.concatenate([h.view(np.uint8) for h in head] + [qh.view(np.uint8), _nibbles(q & 15)], -1)
    else:
        raise ValueError(qtype)
    return raw.reshape(rows, -1), deq.reshape(x.shape)


def llama_cpp_order(w: np.ndarray, heads: int) -> np.ndarray:
    """Rows as llama.cpp's converter stores a Llama q_proj / k_proj (see the module docstring)."""
    d = w.shape[0] // heads
    out = np.empty_like(w)
    for h in range(heads):
        for j in range(d // 2):
            for t in range(2):
                out[h * d + 2 * j + t] = w[h * d + t * (d // 2) + j]
    return out


# a byte-level BPE vocabulary: the 256 byte symbols (GPT-2's byte -> unicode map), a few merges, ChatML specials
def _byte_symbols():
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    out, extra = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return [out[b] for b in range(256)]


SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["h e", "l l", "he ll", "hell o", "Ġ w", "o r", "Ġw or", "Ġwor l", "Ġworl d"]
CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + "
          "'\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


def bpe_vocab():
    """(tokens, token types, merges): specials first (control, type 3), then bytes, then the merged tokens."""
    merged = [m.replace(" ", "") for m in MERGES]
    tokens = SPECIALS + _byte_symbols() + merged
    types = [3] * len(SPECIALS) + [1] * (len(tokens) - len(SPECIALS))
    return tokens, types, list(MERGES)


def hf_weights(rng, *, layers, hidden, heads, kv_heads, head_dim, inter, vocab, tied, bias, qk_norm,
               scale=0.05) -> Dict[str, np.ndarray]:
    """A model's float32 tensors in Hugging Face names and order."""
    def r(*shape):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    q, kv = heads * head_dim, kv_heads * head_dim
    w = {"model.embed_tokens.weight": r(vocab, hidden), "model.norm.weight": 1 + r(hidden)}
    if not tied:
        w["lm_head.weight"] = r(vocab, hidden)
    for i in range(layers):
        p = f"model.layers.{i}."
        w.update({p + "input_layernorm.weight": 1 + r(hidden), p + "post_attention_layernorm.weight": 1 + r(hidden),
                  p + "self_attn.q_proj.weight": r(q, hidden), p + "self_attn.k_proj.weight": r(kv, hidden),
                  p + "self_attn.v_proj.weight": r(kv, hidden), p + "self_attn.o_proj.weight": r(hidden, q),
                  p + "mlp.gate_proj.weight": r(inter, hidden), p + "mlp.up_proj.weight": r(inter, hidden),
                  p + "mlp.down_proj.weight": r(hidden, inter)})
        if bias:
            w.update({p + "self_attn.q_proj.bias": r(q), p + "self_attn.k_proj.bias": r(kv),
                      p + "self_attn.v_proj.bias": r(kv)})
        if qk_norm:
            w.update({p + "self_attn.q_norm.weight": 1 + r(head_dim), p + "self_attn.k_norm.weight": 1 + r(head_dim)})
    return w


GGUF_NAMES = {  # Hugging Face suffix -> llama.cpp's (written out here on purpose: the test's own table)
    "input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_proj.bias": "attn_q.bias", "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias", "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight", "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight", "mlp.down_proj.weight": "ffn_down.weight",
}


def gguf_name(hf: str) -> str:
    if hf == "model.embed_tokens.weight":
        return "token_embd.weight"
    if hf == "model.norm.weight":
        return "output_norm.weight"
    if hf == "lm_head.weight":
        return "output.weight"
    _, _, i, rest = hf.split(".", 3)
    return f"blk.{i}.{GGUF_NAMES[rest]}"


def write_model(path: str, arch: str = "llama", *, layers: int = 2, hidden: int = 64, heads: int = 4,
                kv_heads: int = 2, head_dim: int = 16, inter: int = 96, vocab: Optional[int] = None,
                qtype: str = "F32", tied: bool = True, bias: bool = False, qk_norm: bool = False,
                context: int = 256, theta: float = 500000.0, eps: float = 1e-6, tokenizer: bool = True,
                skip: Sequence[str] = (), meta: Optional[dict] = None, seed: int = 0,
                type_of: Optional[dict] = None, extra: Optional[dict] = None) -> Dict[str, np.ndarray]:
    """Write a GGUF model; returns its ground truth (float64, Hugging Face names and order: what an import must give).

    qtype: the type of the 2-D weights (F32, F16, BF16, Q8_0, Q4_0, Q4_1); norms and biases are F32, as llama.cpp
    writes them. type_of: GGUF name -> a raw type name for single tensors (bytes are random: a type the importer must
    refuse). extra: more GGUF tensors ({name: float32 array}). skip: GGUF tensor names left out. meta: extra or replacing metadata ({key: value}; value None removes)."""
    import gguf
    from ml_dtypes import bfloat16

    tokens, types, merges = bpe_vocab()
    vocab = vocab or len(tokens)
    rng = np.random.default_rng(seed)
    truth32 = hf_weights(rng, layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads, head_dim=head_dim,
                         inter=inter, vocab=vocab, tied=tied, bias=bias, qk_norm=qk_norm)
    keys = {f"{arch}.block_count": layers, f"{arch}.context_length": context, f"{arch}.embedding_length": hidden,
            f"{arch}.feed_forward_length": inter, f"{arch}.attention.head_count": heads,
            f"{arch}.attention.head_count_kv": kv_heads, f"{arch}.rope.freq_base": theta,
            f"{arch}.attention.layer_norm_rms_epsilon": eps, f"{arch}.attention.key_length": head_dim,
            f"{arch}.attention.value_length": head_dim, f"{arch}.rope.dimension_count": head_dim}
    if tokenizer:
        keys.update({"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "default", "tokenizer.ggml.tokens": tokens,
                     "tokenizer.ggml.token_type": types, "tokenizer.ggml.merges": merges,
                     "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 0,
                     "tokenizer.ggml.padding_token_id": 0, "tokenizer.ggml.add_bos_token": False,
                     "tokenizer.chat_template": CHATML})
    keys.update(meta or {})
    w = gguf.GGUFWriter(path, arch)
    for key, value in keys.items():
        if value is None:
            continue
        if isinstance(value, bool):
            w.add_bool(key, value)
        elif isinstance(value, int):
            w.add_uint32(key, value)
        elif isinstance(value, float):
            w.add_float32(key, value)
        elif isinstance(value, str):
            w.add_string(key, value)
        else:
            w.add_array(key, value)
    truth = {}
    for hf, x in truth32.items():
        name = gguf_name(hf)
        if name in skip:
            continue
        permute = heads if ".attn_q." in name else kv_heads if ".attn_k." in name else None
        permute = permute if arch == "llama" else None

        def order(a):
            return llama_cpp_order(a, permute) if permute else a

        if type_of and name in type_of:
            qt = gguf.GGMLQuantizationType[type_of[name]]
            block, size = gguf.GGML_QUANT_SIZES[qt]
            raw = rng.integers(0, 256, (x.shape[0], x.shape[1] // block * size), dtype=np.uint8)
            w.add_tensor(name, raw, raw_dtype=qt)
            continue
        if x.ndim == 1 or qtype == "F32":
            w.add_tensor(name, order(x))
            truth[hf] = x.astype(np.float64)
        elif qtype == "F16":
            w.add_tensor(name, order(x.astype(np.float16)))
            truth[hf] = x.astype(np.float16).astype(np.float64)
        elif qtype == "BF16":
            b = x.astype(bfloat16)
            w.add_tensor(name, order(b.view(np.uint8).reshape(x.shape[0], -1)), raw_dtype=gguf.GGMLQuantizationType.BF16)
            truth[hf] = b.astype(np.float64)
        else:
            raw, deq = quantize(x, qtype)  # blocks lie within rows: reordering rows reorders whole blocks
            w.add_tensor(name, order(raw), raw_dtype=gguf.GGMLQuantizationType[qtype])
            truth[hf] = deq
    for name, x in (extra or {}).items():
        w.add_tensor(name, np.asarray(x, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return truth
