"""Checkpoint tensors (on-disk layout) into a built Paddle model, without PaddleFormers' loader.

The checkpoint contracts (docs/checkpoint.md, docs/mea.md) store Linear weights as [out, in]; Paddle's Linear holds
[in, out], so every `*_proj.weight` is transposed on the way in (the same rule the TP save uses on the way out).
Used where `from_pretrained` cannot run: in tensor-parallel ranks on CPU (PaddleFormers' loader is collective under
the launcher and moves tensors with `.cuda()`) and for the export's reference models.
"""
from __future__ import annotations

import os
from typing import Dict

import numpy as np

from .checkpoint import CheckpointError, is_linear_weight, weight_files

__all__ = ["read_checkpoint_tensors", "load_tensors_into", "load_checkpoint_into"]


def read_checkpoint_tensors(ckpt_dir: str, float32: bool = True) -> Dict[str, np.ndarray]:
    """{name: array} of every weight in the folder (bf16 / fp16 widened to float32; float64 kept with float32=False)."""
    from safetensors import safe_open

    tensors: Dict[str, np.ndarray] = {}
    by_file: Dict[str, list] = {}
    for name, fname in weight_files(ckpt_dir).items():
        by_file.setdefault(fname, []).append(name)
    for fname, names in sorted(by_file.items()):
        with safe_open(os.path.join(ckpt_dir, fname), framework="numpy") as f:
            for n in names:
                a = f.get_tensor(n)  # bf16 arrives as ml_dtypes.bfloat16
                keep = a.dtype in (np.float32, np.float64) and not (float32 and a.dtype == np.float64)
                tensors[n] = a if keep else a.astype(np.float32)
    return tensors


def load_tensors_into(model, tensors: Dict[str, np.ndarray], source: str = "checkpoint") -> None:
    """Set every parameter of `model` from `tensors` (disk layout, names as the model's state_dict); CheckpointError
    naming the first missing, extra or mis-shaped tensor. A tied LM head may be absent (taken from the embedding)."""
    import paddle

    state = model.state_dict()
    extra = sorted(set(tensors) - set(state))
    if extra:
        raise CheckpointError(f"{source}: {len(extra)} tensor(s) the model does not have, e.g. {extra[0]}")
    new = {}
    for name, p in state.items():
        src = tensors.get(name)
        if src is None and name == "lm_head.weight" and "model.embed_tokens.weight" in tensors:
            src = tensors["model.embed_tokens.weight"]  # tie_word_embeddings: the head is the embedding
        if src is None:
            raise CheckpointError(f"{source}: missing tensor {name}")
        if is_linear_weight(name, src.ndim):
            src = src.T
        if list(src.shape) != list(p.shape):
            raise CheckpointError(f"{source}: {name} has shape {list(src.shape)} on disk (after the Linear transpose), "
                                  f"the model expects {list(p.shape)}")
        new[name] = paddle.to_tensor(np.ascontiguousarray(src)).astype(p.dtype)
    model.set_state_dict(new)


def load_checkpoint_into(model, ckpt_dir: str) -> None:
    """Validate `ckpt_dir` against its contract (by config.json model_type) and load its weights into `model`."""
    from .checkpoint import read_config, validate_trainable_checkpoint

    kind, want = read_config(ckpt_dir).get("model_type"), getattr(model.config, "model_type", None)
    if kind != want:
        raise CheckpointError(f"{ckpt_dir}: config.json model_type {kind!r}, the model is {want!r}")
    validate_trainable_checkpoint(ckpt_dir)
    dtype_is_64 = str(next(iter(model.parameters())).dtype).endswith("float64")
    load_tensors_into(model, read_checkpoint_tensors(ckpt_dir, float32=not dtype_is_64), source=ckpt_dir)
