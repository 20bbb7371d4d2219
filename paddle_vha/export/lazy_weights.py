"""A decoder's weights kept out of its ModelProto while graph rewrites run, then read into it once.

The python protobuf runtime (upb) allocates a message's fields in the arena of its root message and frees them only
with the whole message: bytes cleared or replaced in a loaded graph stay allocated. A rewrite that makes new weights
from old ones on a graph holding its weights inline therefore keeps both: untying the LM head and merging the
sibling MatMuls of Qwen3-1.7B took the process from 6.5 GB (the float32 weights) to 18.6 GB (measured), and
onnxruntime's quantizer then passed 24 GB. Here the initializers stay what the file made them (external references
into model.onnx.data, small constants inline) while the rewrites run; a new weight is a recipe, a function of other
weights' arrays, on an initializer that has dims and no data; `materialize` then reads every initializer the graph
still holds into it, once (the float32 weights plus one tensor's working copies at the peak).
"""
from __future__ import annotations

import os
from typing import Callable, Optional

import numpy as np

from .errors import ExportError

__all__ = ["LazyWeights"]


def _dtype(data_type: int):
    from onnx import helper

    return np.dtype(helper.tensor_dtype_to_np_dtype(data_type))


class LazyWeights:
    """The weights of `model` (loaded with load_external_data=False; `base_dir` holds its external data files)."""

    def __init__(self, model, base_dir: Optional[str] = None):
        self.graph = model.graph
        self.base = base_dir
        self.recipes = {}

    def is_matrix(self, t, data_type: int) -> bool:
        """Whether initializer `t` is a 2-D tensor of `data_type` whose values this store can read."""
        return (t.data_type == data_type and len(t.dims) == 2
                and (bool(t.raw_data) or self._external(t) is not None or t.name in self.recipes))

    def _external(self, t) -> Optional[dict]:
        from onnx import TensorProto

        if t.data_location != TensorProto.EXTERNAL:
            return None
        return {e.key: e.value for e in t.external_data}

    def array(self, t) -> np.ndarray:
        """Initializer `t`'s values, independent of the proto from here on: a read-only map of its bytes in the data
        file (external), a copy (inline) or the recipe's result (a weight made by a rewrite)."""
        from onnx import numpy_helper

        if t.name in self.recipes:
            return self.recipes[t.name]()
        meta = self._external(t)
        if meta is None:
            return numpy_helper.to_array(t).copy()
        if self.base is None:
            raise ExportError(f"{t.name}: external data, but the graph's folder is not known")
        path = os.path.join(self.base, meta["location"])
        dtype, shape = _dtype(t.data_type), tuple(int(d) for d in t.dims)
        n = int(np.prod(shape)) * dtype.itemsize
        if int(meta.get("length", n)) != n or not os.path.isfile(path) or \
                os.path.getsize(path) < int(meta.get("offset", 0)) + n:
            raise ExportError(f"{t.name}: its external data in {meta['location']} is missing or shorter than "
                              f"{shape} {dtype}")
        return np.memmap(path, dtype=dtype, mode="r", offset=int(meta.get("offset", 0)), shape=shape)

    def add(self, name: str, data_type: int, dims, make: Callable[[], np.ndarray]):
        """A new initializer `name` whose values `make()` computes at materialize (it must not read the proto: take
        the source arrays from `array` when the recipe is made)."""
        from onnx import TensorProto

        tensor = self.graph.initializer.add()
        tensor.name, tensor.data_type = name, data_type
        tensor.dims.extend(int(d) for d in dims)
        self.recipes[name] = make
        return tensor

    def release(self, name: str) -> None:
        """Forget initializer `name`'s recipe (and the source arrays it holds: maps of the data file whose pages count
        in this process' resident memory while mapped); for a weight consumed without being materialized."""
        self.recipes.pop(name, None)

    def materialize(self) -> None:
        """Every initializer of the graph inline: recipes computed, external data read, one tensor at a time."""
        from onnx import TensorProto

        for t in self.graph.initializer:
            if t.name in self.recipes:
                data = np.ascontiguousarray(self.recipes.pop(t.name)(), dtype=_dtype(t.data_type))
                assert data.shape == tuple(t.dims), f"{t.name}: recipe gave {data.shape}, declared {tuple(t.dims)}"
            elif self._external(t) is not None:
                data = self.array(t)
            else:
                continue
            del t.external_data[:]
            t.data_location = TensorProto.DEFAULT
            t.raw_data = data.tobytes()
            del data
        self.recipes.clear()
