"""The on-disk checkpoint contract: tensor names and shapes, and validation with one-line errors.

Layout (Hugging Face style, what PaddleFormers writes for Qwen3): safetensors files, optionally sharded
with `model.safetensors.index.json`; Linear weights stored [out, in]; config.json beside them.
This module reads only file headers, never tensor data, so validating an 8B checkpoint is instant.
"""
from __future__ import annotations

import json
import os
import re
from typing import Dict, Tuple

from safetensors import safe_open

__all__ = [
    "CheckpointError",
    "qwen3_tensor_shapes",
    "vha_tensor_shapes",
    "read_config",
    "read_tensor_shapes",
    "validate_vha_checkpoint",
    "validate_trainable_checkpoint",
    "is_linear_weight",
]

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
# Files of a checkpoint folder that describe its weights: a converter rewrites or drops them, never copies them.
WEIGHT_FILES = re.compile(r"(\.safetensors|\.safetensors\.index\.json|\.pdparams|\.bin|\.pt|\.pth|\.metadata)$|^saved_signal_")

Shapes = Dict[str, Tuple[int, ...]]


class CheckpointError(ValueError):
    """A checkpoint folder that does not match the contract; the message is one line naming the problem."""


def is_linear_weight(name: str, ndim: int) -> bool:
    """A Linear weight: [out, in] on disk, [in, out] in Paddle's memory (transposed on every load and save)."""
    return ndim == 2 and name.endswith("_proj.weight")


def qwen3_tensor_shapes(cfg) -> Shapes:
    """Stock Qwen3 tensor names -> HF-layout shapes ([out, in] for Linear weights)."""
    h, d, L = cfg.hidden_size, cfg.head_dim, cfg.num_hidden_layers
    h_q, h_kv, inter, vocab = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.intermediate_size, cfg.vocab_size
    shapes: Shapes = {"model.embed_tokens.weight": (vocab, h), "model.norm.weight": (h,)}
    if not cfg.tie_word_embeddings:
        shapes["lm_head.weight"] = (vocab, h)
    for i in range(L):
        p = f"model.layers.{i}."
        shapes.update(
            {
                p + "input_layernorm.weight": (h,),
                p + "post_attention_layernorm.weight": (h,),
                p + "mlp.gate_proj.weight": (inter, h),
                p + "mlp.up_proj.weight": (inter, h),
                p + "mlp.down_proj.weight": (h, inter),
                p + "self_attn.q_proj.weight": (h_q * d, h),
                p + "self_attn.k_proj.weight": (h_kv * d, h),
                p + "self_attn.v_proj.weight": (h_kv * d, h),
                p + "self_attn.o_proj.weight": (h, h_q * d),
                p + "self_attn.q_norm.weight": (d,),
                p + "self_attn.k_norm.weight": (d,),
            }
        )
        if cfg.attention_bias:
            shapes.update(
                {
                    p + "self_attn.q_proj.bias": (h_q * d,),
                    p + "self_attn.k_proj.bias": (h_kv * d,),
                    p + "self_attn.v_proj.bias": (h_kv * d,),
                    p + "self_attn.o_proj.bias": (h,),
                }
            )
    return shapes


def vha_tensor_shapes(cfg) -> Shapes:
    """Qwen3-VHA tensor names -> shapes: stock Qwen3 with a narrower q_proj and the vha_* tensors."""
    shapes = qwen3_tensor_shapes(cfg)
    h, d, h_v, h_kv = cfg.hidden_size, cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads
    h_p, r, rank = h_v // h_kv, cfg.vha_q_head_dim, cfg.vha_postmix_rank
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}.self_attn."
        shapes[p + "q_proj.weight"] = (h_p * r, h)
        if cfg.attention_bias:
            shapes[p + "q_proj.bias"] = (h_p * r,)
        shapes[p + "vha_premix_weight"] = (h_kv, r, d)
        shapes[p + "vha_postmix_U"] = (h_v, rank)
        shapes[p + "vha_postmix_V"] = (h_v, rank)
        if cfg.vha_gated_attention:
            shapes[p + "gate_proj.weight"] = (h_v * d, h)
    return shapes


def read_config(ckpt_dir: str) -> dict:
    """config.json of a checkpoint folder as a dict (CheckpointError if absent or not JSON)."""
    if not os.path.isdir(ckpt_dir):
        raise CheckpointError(f"{ckpt_dir}: not a directory")
    path = os.path.join(ckpt_dir, "config.json")
    if not os.path.isfile(path):
        raise CheckpointError(f"{path}: missing (a checkpoint folder needs config.json)")
    try:
        with open(path, encoding="utf-8") as f:
            cfg = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(cfg, dict):
        raise CheckpointError(f"{path}: expected a JSON object")
    return cfg


def weight_files(ckpt_dir: str) -> Dict[str, str]:
    """Tensor name -> safetensors file name, from the index json or the single model.safetensors."""
    index = os.path.join(ckpt_dir, INDEX_FILE)
    if os.path.isfile(index):
        try:
            with open(index, encoding="utf-8") as f:
                weight_map = json.load(f)["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise CheckpointError(f"{index}: malformed index ({type(e).__name__}: {e})") from None
        for fname in sorted(set(weight_map.values())):
            if not os.path.isfile(os.path.join(ckpt_dir, fname)):
                raise CheckpointError(f"{index}: lists shard {fname!r}, which is missing")
        return dict(weight_map)
    single = os.path.join(ckpt_dir, SINGLE_FILE)
    if os.path.isfile(single):
        return {name: SINGLE_FILE for name in _header_shapes(single)}
    raise CheckpointError(f"{ckpt_dir}: no {INDEX_FILE} or {SINGLE_FILE}")


def _header_shapes(path: str) -> Shapes:
    try:
        with safe_open(path, framework="numpy") as f:
            return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    except Exception as e:  # safetensors raises its own error types for bad headers
        raise CheckpointError(f"{path}: unreadable safetensors file ({type(e).__name__}: {e})") from None


def read_tensor_shapes(ckpt_dir: str) -> Shapes:
    """Every tensor's name and shape, read from safetensors headers only."""
    weight_map = weight_files(ckpt_dir)
    shapes: Shapes = {}
    for fname in sorted(set(weight_map.values())):
        for name, shape in _header_shapes(os.path.join(ckpt_dir, fname)).items():
            if weight_map.get(name) == fname:
                shapes[name] = shape
    missing_in_files = sorted(set(weight_map) - set(shapes))
    if missing_in_files:
        raise CheckpointError(
            f"{ckpt_dir}: index lists tensors its shard does not hold: {_few(missing_in_files)}"
        )
    return shapes


def _few(names, n: int = 3) -> str:
    names = list(names)
    more = f" (+{len(names) - n} more)" if len(names) > n else ""
    return ", ".join(names[:n]) + more


def compare_shapes(ckpt_dir: str, found: Shapes, expected: Shapes) -> None:
    """CheckpointError naming missing, unexpected or mis-shaped tensors."""
    missing = sorted(set(expected) - set(found))
    if missing:
        raise CheckpointError(f"{ckpt_dir}: missing tensors: {_few(missing)}")
    extra = sorted(set(found) - set(expected))
    if extra:
        raise CheckpointError(f"{ckpt_dir}: unexpected tensors: {_few(extra)}")
    bad = [f"{n} {list(found[n])} (expected {list(expected[n])})" for n in sorted(expected) if found[n] != expected[n]]
    if bad:
        raise CheckpointError(f"{ckpt_dir}: mis-shaped tensors: {_few(bad)}")


def load_typed_config(ckpt_dir: str, config_cls, label: str):
    """`config_cls` of a checkpoint folder whose model_type must be config_cls.model_type; config errors become
    one-line CheckpointErrors. `label` names the model family in the message."""
    raw = read_config(ckpt_dir)
    if raw.get("model_type") != config_cls.model_type:
        raise CheckpointError(
            f"{ckpt_dir}: not a {label} checkpoint (config.json model_type={raw.get('model_type')!r}, "
            f"expected {config_cls.model_type!r})"
        )
    try:
        return config_cls.from_dict(raw)
    except (ValueError, TypeError) as e:
        raise CheckpointError(f"{ckpt_dir}/config.json: {e}") from None


def load_vha_config(ckpt_dir: str):
    """Qwen3VHAConfig of a checkpoint folder, with config errors turned into one-line CheckpointErrors."""
    from .config import Qwen3VHAConfig  # local: keeps this module importable without PaddleFormers' models

    return load_typed_config(ckpt_dir, Qwen3VHAConfig, "Qwen3-VHA")


def validate_vha_checkpoint(ckpt_dir: str):
    """Check a Qwen3-VHA checkpoint folder against the contract; returns its config."""
    cfg = load_vha_config(ckpt_dir)
    compare_shapes(ckpt_dir, read_tensor_shapes(ckpt_dir), vha_tensor_shapes(cfg))
    return cfg


def validate_trainable_checkpoint(ckpt_dir: str):
    """A Qwen3-MEA folder against the MEA contract, anything else against the Qwen3-VHA one; returns its config."""
    if read_config(ckpt_dir).get("model_type") == "qwen3_mea":
        from .mea.checkpoint import validate_mea_checkpoint

        return validate_mea_checkpoint(ckpt_dir)
    return validate_vha_checkpoint(ckpt_dir)
