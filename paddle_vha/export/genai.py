"""What onnxruntime-genai needs beside an exported decoder: genai_config.json, and a tokenizer.

genai's decoder (the family's GENAI_MODEL_TYPE: "qwen3" for stock Qwen3) takes our I/O names as they are (`past_key_values.%d.key` / `.value` ->
`present.%d.key` / `.value`), needs every layer's cache as a key and a value tensor of num_key_value_heads heads of
head_size, and grows the cache by one position per step. So the config is written for stock Qwen3 exports; a family
or layer it cannot run (one shared K = V tensor, MEA's wide head, sliding-window layers whose cache keeps only the
window) gets one line saying why instead.

The checkpoint's own tokenizer files are copied by the export. A checkpoint without one and with a 256-entry
vocabulary (the byte-level models tools/train.py and the quick-start make) gets a tokenizer.json that maps byte b to
token b (a byte-level BPE with no merges), so genai's Tokenizer, and Hugging Face's, round-trip any UTF-8 text.
"""
from __future__ import annotations

import json
import os
from typing import List, Optional, Tuple

__all__ = ["genai_refusal", "genai_config", "byte_tokenizer", "write_genai_files", "TOKENIZER_FILES"]

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt", "tokenizer.model")
BYTE_VOCAB = 256


def genai_refusal(cfg, label: str, genai_model_type: Optional[str], cache_names: List[tuple],
                  cache_shapes: List[tuple], windows: List[Optional[int]], cache_io: str = "concat") -> Optional[str]:
    """Why onnxruntime-genai cannot run this export, or None (label, genai_model_type: the family's, from the
    registry; the serving plan asks once)."""
    if cache_io != "concat":
        return "the buffer flavour's cache interface (buffers in, new positions out) is this project's own"
    if getattr(cfg, "window_attention_sinks", False) and any(windows):
        return "window_attention_sinks: onnxruntime-genai's qwen3 decoder has no attention sink in its softmax"
    if genai_model_type is None:
        return f"onnxruntime-genai has no decoder type for {label}"
    if any(tuple(n) != ("key", "value") for n in cache_names):
        return "its layers cache one tensor (K = V), not a key and a value"
    want = (cfg.num_key_value_heads, cfg.head_dim)
    odd = [i for i, s in enumerate(cache_shapes) if tuple(s) != want]
    if odd:
        return (f"layer {odd[0]} caches {cache_shapes[odd[0]][0]} heads of width {cache_shapes[odd[0]][1]}, not the "
                f"{want[0]} x {want[1]} genai assumes for every layer")
    if any(windows):
        return "its sliding-window layers keep only the window's positions, and genai's cache grows on every layer"
    return None


def _token_id(value) -> Optional[int]:
    if isinstance(value, list):
        value = value[0] if value else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _search(gen: dict, context: int) -> dict:
    """genai's search block: greedy (do_sample false), as tools/generate.py and the export's own validation decode;
    the checkpoint's sampling values (temperature, top_k, top_p of generation_config.json) are kept for a caller
    who turns sampling on (`set_search_options(do_sample=True)`), and are inert until then."""
    def number(key, default, kind):
        v = gen.get(key)
        return kind(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 else default

    return {
        "do_sample": False, "num_beams": 1, "num_return_sequences": 1, "max_length": context, "min_length": 0,
        "temperature": number("temperature", 1.0, float), "top_k": number("top_k", 50, int),
        "top_p": min(number("top_p", 1.0, float), 1.0), "repetition_penalty": 1.0, "length_penalty": 1.0,
        "diversity_penalty": 0.0, "no_repeat_ngram_size": 0, "early_stopping": True,
        "past_present_share_buffer": False,  # present is past + new, a new tensor each step
    }


def genai_config(plan, generation_config: Optional[dict] = None) -> dict:
    """genai_config.json for a stock-Qwen3-served export (a ServingPlan, paddle_vha/export/plan.py): sizes from the
    config; bos / eos / pad from generation_config.json, else config.json (eos as given, a list where the checkpoint
    lists several, e.g. Qwen3's [<|im_end|>, <|endoftext|>]; NUL, id 0, where neither says: genai needs ids, and a
    byte-level model never emits NUL in text); greedy search up to the context length (`_search`)."""
    cfg, raw_config = plan.config, plan.folder.config
    gen = generation_config or {}

    def ids(key):
        v = gen.get(key, raw_config.get(key))
        return v if isinstance(v, list) and v and all(_token_id(x) is not None for x in v) else _token_id(v)

    eos = ids("eos_token_id")
    eos = 0 if eos is None else eos
    pad = ids("pad_token_id")
    pad = _token_id(eos) if pad is None else _token_id(pad)
    bos = ids("bos_token_id")
    bos = _token_id(eos) if bos is None else _token_id(bos)
    context = int(cfg.max_position_embeddings)
    return {
        "model": {
            "type": plan.genai_model_type,
            "bos_token_id": bos,
            "eos_token_id": eos,
            "pad_token_id": pad,
            "vocab_size": int(cfg.vocab_size),
            "context_length": context,
            "decoder": {
                "session_options": {"log_id": "onnxruntime-genai", "provider_options": []},
                "filename": "model.onnx",
                "head_size": int(cfg.head_dim),
                "hidden_size": int(cfg.hidden_size),
                "num_attention_heads": int(cfg.num_attention_heads),
                "num_key_value_heads": int(cfg.num_key_value_heads),
                "num_hidden_layers": int(cfg.num_hidden_layers),
                "inputs": {"input_ids": "input_ids", "attention_mask": "attention_mask", "position_ids": "position_ids",
                           "past_key_names": "past_key_values.%d.key", "past_value_names": "past_key_values.%d.value"},
                "outputs": {"logits": "logits", "present_key_names": "present.%d.key",
                            "present_value_names": "present.%d.value"},
            },
        },
        "search": _search(gen, context),
    }


def _bytes_to_unicode() -> dict:
    """GPT-2's byte -> printable character table (what a ByteLevel pre-tokenizer and decoder use)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


def byte_tokenizer(model_max_length: int) -> Tuple[dict, dict]:
    """(tokenizer.json, tokenizer_config.json) of the identity byte tokenizer: token b is byte b."""
    chars = _bytes_to_unicode()
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}
    tokenizer = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": [], "normalizer": None,
        "pre_tokenizer": byte_level, "post_processor": None, "decoder": dict(byte_level),
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": {chars[b]: b for b in range(256)}, "merges": []},
    }
    # GPT2Tokenizer's defaults would add "<|endoftext|>" as token 256 to a 256-token model (transformers then has 257
    # tokens; llama.cpp's converter asserts every id < vocab_size): no special tokens, explicitly
    config = {"tokenizer_class": "GPT2Tokenizer", "model_max_length": int(model_max_length), "add_bos_token": False,
              "add_prefix_space": False, "clean_up_tokenization_spaces": False, "bos_token": None, "eos_token": None,
              "unk_token": None, "pad_token": None}
    return tokenizer, config


def write_genai_files(out_dir: str, plan, log=print) -> None:
    """Write genai_config.json for the export of `plan` (a ServingPlan; or say in one line why not) and, for a
    byte-level model without a tokenizer, the byte tokenizer. The checkpoint's own tokenizer files are already in
    out_dir (the export copies them)."""
    cfg = plan.config
    if plan.genai_refusal:
        log(f"onnxruntime-genai: genai_config.json not written: {plan.genai_refusal}")
    else:
        gen_path = os.path.join(out_dir, "generation_config.json")
        gen = json.load(open(gen_path)) if os.path.isfile(gen_path) else None
        with open(os.path.join(out_dir, "genai_config.json"), "w") as f:
            json.dump(genai_config(plan, gen), f, indent=2)
        log(f"onnxruntime-genai: wrote genai_config.json (model type {plan.genai_model_type})")
    if any(os.path.isfile(os.path.join(out_dir, n)) for n in TOKENIZER_FILES):
        return
    if int(cfg.vocab_size) == BYTE_VOCAB:
        tokenizer, config = byte_tokenizer(cfg.max_position_embeddings)
        for name, obj in (("tokenizer.json", tokenizer), ("tokenizer_config.json", config)):
            with open(os.path.join(out_dir, name), "w", encoding="utf-8") as f:
                json.dump(obj, f, ensure_ascii=False, indent=1)
        log("tokenizer: none in the checkpoint and 256 tokens: wrote the byte-level tokenizer (token b = byte b)")
    else:
        log("tokenizer: none in the checkpoint; genai and Optimum need one to encode text (token ids work as they are)")
