"""Checkpoint tensors (on-disk layout) into a built Paddle model, without PaddleFormers' loader.

The checkpoint contracts (docs/checkpoint.md, docs/mea.md) store Linear weights as [out, in]; Paddle's Linear holds
[in, out], so every `*_proj.weight` is transposed on the way in (the same rule the TP save uses on the way out).
Used where `from_pretrained` cannot run: in tensor-parallel ranks on CPU (PaddleFormers' loader is collective under
the launcher and moves tensors with `.cuda()`) and for the export's reference models.
"""
from __future__ import annotations

from typing import Dict

import numpy as np

from .contract import CheckpointError, is_linear_weight
from .folder import CheckpointFolder

__all__ = ["load_tensors_into", "load_checkpoint_into"]


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


def load_checkpoint_into(model, folder) -> None:
    """Validate a checkpoint folder (path or CheckpointFolder) against the contract of `model`'s family (its class's
    validate_checkpoint, paddle_vha/modeling/checkpointing.py) and load its weights into `model`."""
    ck = CheckpointFolder.open(folder)
    want = getattr(model.config, "model_type", None)
    if ck.model_type != want:
        raise CheckpointError(f"{ck.path}: config.json model_type {ck.model_type!r}, the model is {want!r}")
    validate = getattr(type(model), "validate_checkpoint", None)
    if validate is None:
        raise CheckpointError(f"{ck.path}: {type(model).__name__} declares no tensor contract to check the folder against")
    validate(ck)
    dtype_is_64 = str(next(iter(model.parameters())).dtype).endswith("float64")
    load_tensors_into(model, ck.read_all(float32=not dtype_is_64), source=ck.path)

