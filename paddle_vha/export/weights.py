"""The real weights into a graph converted without them (paddle_vha/export/paddle_program.py): inline, or as ONNX
external data in model.onnx.data.

Every parameter came out of paddle2onnx as an initializer named by the parameter and holding its stand-in, the one
float32 value k of its index in the parameter file. `attach_weights` checks each such initializer is exactly that
(a stand-in the converter folded into something else would carry another name or value: refused), then gives it
the parameter's dims and data, copied from the Paddle program's own parameter file (the bytes Paddle Inference
reads, float32 row-major in both formats) in 64 MB pieces: external data never holds more than one piece in memory
and never builds a ModelProto over protobuf's 2 GB limit; inline data is for graphs under it (`needs_external_data`).
"""
from __future__ import annotations

import os
from typing import List

from .errors import ExportError
from .paddle_program import ParamEntry

__all__ = ["PROTOBUF_LIMIT", "needs_external_data", "attach_weights", "DATA_FILE"]

PROTOBUF_LIMIT = 2**31 - 1  # protobuf refuses to serialize a message larger than this (2 GiB - 1 byte)
MARGIN = 1 << 20  # per-tensor field overhead of the inlined weights (tags, lengths, dims), with room to spare
DATA_FILE = "model.onnx.data"
ALIGN = 4096  # each tensor's offset in the data file: page-aligned, so a runtime may map it instead of copying
PIECE = 64 << 20


def needs_external_data(weight_bytes: int, graph_bytes: int) -> bool:
    """Whether a graph of `graph_bytes` serialized (weights left out) with `weight_bytes` of weights inlined would
    pass protobuf's limit, i.e. the weights must go to external data."""
    return graph_bytes + weight_bytes + MARGIN > PROTOBUF_LIMIT


def _standin_index(tensor) -> int:
    """The stand-in value of an initializer (one float32), or -1 if it holds anything else."""
    from onnx import TensorProto, numpy_helper

    if tensor.data_type != TensorProto.FLOAT or list(tensor.dims) != [1]:
        return -1
    value = float(numpy_helper.to_array(tensor).reshape(-1)[0])
    return int(value) if value.is_integer() and value >= 0 else -1


def _copy(src, dst, offset: int, nbytes: int) -> None:
    src.seek(offset)
    left = nbytes
    while left:
        piece = src.read(min(PIECE, left))
        if not piece:
            raise ExportError(f"{src.name}: ends inside a parameter")
        dst.write(piece)
        left -= len(piece)


def _set_external(tensor, location: str, offset: int, nbytes: int) -> None:
    from onnx import TensorProto

    tensor.ClearField("float_data")
    tensor.ClearField("raw_data")
    del tensor.external_data[:]
    tensor.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", str(offset)), ("length", str(nbytes))):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value


def _attach_one(tensor, entry: ParamEntry, params, data) -> None:
    """Tensor `tensor` (a stand-in) becomes parameter `entry`: inline (data None) or appended to `data`."""
    del tensor.dims[:]
    tensor.dims.extend(entry.dims)
    if data is None:
        params.seek(entry.offset)
        tensor.ClearField("float_data")
        tensor.raw_data = params.read(entry.nbytes)
        return
    offset = -(-data.tell() // ALIGN) * ALIGN
    data.write(b"\0" * (offset - data.tell()))
    _copy(params, data, entry.offset, entry.nbytes)
    _set_external(tensor, DATA_FILE, offset, entry.nbytes)


def attach_weights(model, entries: List[ParamEntry], params_path: str, out_dir: str, external: bool) -> int:
    """Replace the stand-ins of `model`'s graph (paddle_program.convert_without_weights) by the parameters of
    `params_path`, inline or in out_dir/model.onnx.data; returns the bytes attached. A parameter the graph no
    longer reads (pruned) is not written; an initializer named by a parameter but not holding its stand-in is
    refused (ExportError). The self-validation then checks the result against Paddle."""
    by_name = {e.name: (k, e) for k, e in enumerate(entries)}
    attached = 0
    data = open(os.path.join(out_dir, DATA_FILE), "wb") if external else None
    try:
        with open(params_path, "rb") as params:
            for tensor in model.graph.initializer:
                if tensor.name not in by_name:
                    continue
                k, entry = by_name[tensor.name]
                if _standin_index(tensor) != k:
                    raise ExportError(f"paddle2onnx changed parameter {tensor.name} (dims {list(tensor.dims)}); "
                                      "cannot attach its weights")
                _attach_one(tensor, entry, params, data)
                attached += entry.nbytes
    finally:
        if data is not None:
            data.close()
    return attached
