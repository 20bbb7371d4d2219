"""The checkpoint's tensors as the export reads them, one at a time, and the family's PaddleFormers model on them.

`CheckpointTensors` is a read-only mapping over an opened CheckpointFolder: each lookup reads that one tensor from
its safetensors file as float32 (16-bit floats widened exactly) and refuses a tensor holding NaN or Inf (a NaN would
pass the export's own checks unnoticed: it would compare two NaN models). Nothing is cached: the decoder and the
reference model read each tensor once, so no whole copy of the checkpoint is ever held in memory.

`reference_model` builds the family's PaddleFormers causal LM and sets its parameters one by one (disk layout ->
Paddle's [in, out] Linears), so loading it needs the model plus one tensor, not the model plus two copies.
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ..checkpoint import safetensors_io as st
from ..checkpoint.contract import CheckpointError, is_linear_weight

__all__ = ["CheckpointTensors", "reference_model", "weight_bytes"]


class CheckpointTensors(Mapping):
    """name -> float32 array of a CheckpointFolder's tensors, read on each lookup (see the module docstring)."""

    def __init__(self, folder):
        self.folder = folder

    def __getitem__(self, name: str) -> np.ndarray:
        a = _float32(st.read_tensor(self.folder.tensors[name]))
        bad = _non_finite(a)
        if bad:
            raise CheckpointError(f"{self.folder.path}: {name} holds {bad} non-finite value(s) (NaN or Inf); "
                                  "refusing to export")
        return a

    def __iter__(self):
        return iter(self.folder.tensors)

    def __len__(self) -> int:
        return len(self.folder.tensors)

    def __contains__(self, name) -> bool:
        return name in self.folder.tensors


def _float32(a: np.ndarray) -> np.ndarray:
    """a as float32; bfloat16 widened in place of one uint32 array (no second full-size temporary)."""
    if a.dtype == np.float32:
        return a
    if a.dtype == st.DTYPES["BF16"]:
        wide = a.view(np.uint16).astype(np.uint32)
        del a
        np.left_shift(wide, 16, out=wide)  # bfloat16 is the top half of a float32
        return wide.view(np.float32)
    return st.to_float32(a)


def _non_finite(a: np.ndarray, block: int = 1 << 22) -> int:
    """How many values of `a` are NaN or Inf, counted in blocks (no full-size mask)."""
    flat = a.reshape(-1)
    return sum(int(b.size - np.count_nonzero(np.isfinite(b))) for b in (flat[i:i + block]
                                                                    for i in range(0, flat.size, block)))


def weight_bytes(folder, largest: bool = False) -> int:
    """The checkpoint's weights in float32 bytes (what the export holds per copy), from the headers alone; with
    `largest`, its largest tensor's float32 bytes instead."""
    sizes = []
    for ref in folder.tensors.values():
        n = 1
        for d in ref.shape:
            n *= d
        sizes.append(4 * n)
    return max(sizes, default=0) if largest else sum(sizes)


def reference_model(plan, tensors):
    """The family's PaddleFormers causal LM holding `tensors` (a mapping in disk layout), eval mode; CheckpointError
    naming a tensor the model lacks or that it has with another shape. A tied LM head may be absent (it is the
    embedding)."""
    model = plan.family.model_class(plan.config)
    model.eval()
    state = model.state_dict()
    extra = sorted(set(tensors) - set(state))
    if extra:
        raise CheckpointError(f"reference model: {len(extra)} tensor(s) the model does not have, e.g. {extra[0]}")
    for name, p in state.items():
        key = name
        if name not in tensors and name == "lm_head.weight" and "model.embed_tokens.weight" in tensors:
            key = "model.embed_tokens.weight"  # tie_word_embeddings: the head is the embedding
        if key not in tensors:
            raise CheckpointError(f"reference model: missing tensor {name}")
        src = tensors[key]
        if is_linear_weight(name, src.ndim):
            src = src.T
        if list(src.shape) != list(p.shape):
            raise CheckpointError(f"reference model: {name} has shape {list(src.shape)} on disk (after the Linear "
                                  f"transpose), the model expects {list(p.shape)}")
        _set(p, np.ascontiguousarray(src, dtype=np.float32))
        del src
    return model


def _set(param, value: np.ndarray) -> None:
    """param <- value (float32), cast to the parameter's dtype on the way."""
    import paddle

    if str(param.dtype).endswith("float32"):
        param.set_value(value)
    else:
        param.set_value(paddle.to_tensor(value).astype(param.dtype))
