"""The decoder as a static Paddle program, and its conversion to ONNX without its weights.

`save_program` writes the program Paddle Inference runs (PREFIX.json, a PIR program, and PREFIX.pdiparams, every
parameter in Paddle's combined-tensor stream). `read_params` lists that file's tensors (name, dims, byte range of
the data) without reading the data. `convert_without_weights` hands paddle2onnx the program with a stand-in
parameter file in which every parameter is one float32 (its index), so the converter builds, and protobuf
serializes, a graph of a few MB at any model size: paddle2onnx 2.1.0 writes a 0-byte model once the weights pass
protobuf's 2 GB limit, whatever its external-data option says. paddle2onnx emits each parameter as a Constant
named by the parameter; paddle_vha/export/weights.py puts the real tensors back, read from PREFIX.pdiparams.

The combined-tensor stream (Paddle's save_combine, the layout paddle2onnx and Paddle Inference read), per tensor:
uint32 version 0, uint64 LoD levels 0, uint32 version 0, int32 n, n bytes of a VarType.TensorDesc protobuf
(field 1: data type, 5 = FP32; field 2: dims, unpacked varints), then the data, row-major little-endian. jit.save
writes the parameters sorted by name; `read_params` checks the dims against the program's.
"""
from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
from dataclasses import dataclass
from typing import Dict, List, Tuple

from .errors import ExportError

__all__ = ["ParamEntry", "save_program", "read_params", "program_params", "write_standin_params",
           "run_paddle2onnx", "run_child", "convert_without_weights"]

FP32 = 5  # VarType.Type FP32 in a TensorDesc
_HEAD = struct.Struct("<IQIi")  # version, LoD levels, version, TensorDesc size


@dataclass(frozen=True)
class ParamEntry:
    """One parameter in PREFIX.pdiparams: its name, dims, and where its float32 data sits in the file."""

    name: str
    dims: Tuple[int, ...]
    offset: int
    nbytes: int


def save_program(decoder, plan, prefix: str) -> None:
    """jit.save of the decoder with the plan's graph inputs: PREFIX.json + PREFIX.pdiparams."""
    import paddle
    from paddle.static import InputSpec

    ins, _ = plan.io_names
    kv = [InputSpec([None, h, None, w], "float32", n) for n, (h, w) in zip(ins[3:], plan.cache_inputs)]
    specs = [InputSpec([None, None], "int64", n) for n in ins[:3]] + [kv]
    static = paddle.jit.to_static(decoder, input_spec=specs, full_graph=True)
    paddle.jit.save(static, prefix, input_spec=specs)


def program_params(model_json: str) -> Dict[str, Tuple[int, ...]]:
    """{parameter name: dims} of a PIR program saved as json (its top block's builtin.parameter ops)."""
    with open(model_json, encoding="utf-8") as f:
        program = json.load(f)
    try:
        ops = program["program"]["regions"][0]["blocks"][0]["ops"]
        return {op["A"][3]: tuple(op["O"]["TT"]["D"][1]) for op in ops if op.get("#") == "p"}
    except (KeyError, IndexError, TypeError) as e:
        raise ExportError(f"{model_json}: not a PIR program as Paddle 3 writes it ({type(e).__name__}: {e})") from None


def _varint(buf: bytes, i: int) -> Tuple[int, int]:
    value = shift = 0
    while True:
        byte = buf[i]
        i += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, i


def _tensor_desc(buf: bytes) -> Tuple[int, List[int]]:
    """(data type, dims) of a serialized VarType.TensorDesc."""
    i, dtype, dims = 0, None, []
    while i < len(buf):
        key, i = _varint(buf, i)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(buf, i)
            if field == 1:
                dtype = value
            elif field == 2:
                dims.append(value)
        elif wire == 2:  # packed dims
            n, i = _varint(buf, i)
            j, end = i, i + n
            while j < end:
                value, j = _varint(buf, j)
                dims.append(value)
            i = end
        else:
            raise ExportError(f"unexpected TensorDesc wire type {wire}")
    return dtype, dims


def read_params(prefix: str) -> List[ParamEntry]:
    """The parameters of PREFIX.pdiparams in file order, named from PREFIX.json (sorted names, as jit.save writes
    them), float32 and with the program's dims; ExportError otherwise. Reads the headers only."""
    declared = program_params(prefix + ".json")
    names = sorted(declared)
    path, out = prefix + ".pdiparams", []
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        for name in names:
            head = f.read(_HEAD.size)
            if len(head) < _HEAD.size:
                raise ExportError(f"{path}: ends after {len(out)} of {len(names)} parameters")
            _, lod, _, n = _HEAD.unpack(head)
            dtype, dims = _tensor_desc(f.read(n))
            if lod != 0 or dtype != FP32 or tuple(dims) != declared[name]:
                raise ExportError(f"{path}: parameter {len(out)} is {dims} (type {dtype}, LoD {lod}); the program "
                                   f"declares {name} as {list(declared[name])} float32")
            numel = 1
            for d in dims:
                numel *= d
            out.append(ParamEntry(name, tuple(dims), f.tell(), 4 * numel))
            f.seek(4 * numel, os.SEEK_CUR)
        end = f.tell()
    if end != size:
        raise ExportError(f"{path}: {size - end} bytes after the program's {len(names)} parameters")
    return out


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | 0x80 if value else byte)
        if not value:
            return bytes(out)


def write_standin_params(entries: List[ParamEntry], path: str) -> None:
    """A combined-tensor file in which parameter k (file order) is the one float32 value k, shape [1]."""
    desc = b"\x08" + _encode_varint(FP32) + b"\x10" + _encode_varint(1)
    with open(path, "wb") as f:
        for k, _ in enumerate(entries):
            f.write(_HEAD.pack(0, 0, 0, len(desc)) + desc + struct.pack("<f", float(k)))


def _die_with_parent(parent: int):
    """A preexec_fn for a child that must not outlive this process: Linux sends it SIGKILL when its parent dies
    (prctl PR_SET_PDEATHSIG), even by SIGKILL, where no cleanup of ours runs. (SIGTERM and Ctrl-C reach the parent's
    handlers, and subprocess.run kills the child on the way out.) Elsewhere, a no-op."""
    def preexec():
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG = 1
        except (OSError, AttributeError):
            return
        if os.getppid() != parent:  # the parent died before prctl took effect
            os.kill(os.getpid(), signal.SIGKILL)
    return preexec


def run_child(argv, **kwargs) -> subprocess.CompletedProcess:
    """subprocess.run(argv) whose child dies with this process (_die_with_parent); output captured as text."""
    return subprocess.run(argv, capture_output=True, text=True, errors="replace",
                          preexec_fn=_die_with_parent(os.getpid()), **kwargs)


def run_paddle2onnx(model_json: str, params: str, out: str, opset: int) -> None:
    """paddle2onnx in a child process: its C++ code aborts the whole process on some inputs (an unsupported opset
    exits 134 with no message), and prints progress lines we do not want on the terminal. Its own words reach the
    user when it fails (ExportError, one line). The child dies with the export (run_child), however it is killed."""
    code = ("import sys, paddle2onnx; paddle2onnx.export(sys.argv[1], sys.argv[2], sys.argv[3], "
            "opset_version=int(sys.argv[4]), auto_upgrade_opset=False, optimize_tool='None')")
    r = run_child([sys.executable, "-c", code, model_json, params, out, str(opset)])
    said = [ln.strip() for ln in (r.stdout + "\n" + r.stderr).splitlines() if ln.strip()]
    if r.returncode != 0 or not os.path.isfile(out) or os.path.getsize(out) == 0:
        how = f"exit code {r.returncode}" if r.returncode >= 0 else f"killed by signal {-r.returncode}"
        last = said[-1] if said else "no output"
        raise ExportError(f"paddle2onnx failed ({how}): {last[:400]}")


def convert_without_weights(prefix: str, out: str, opset: int) -> List[ParamEntry]:
    """paddle2onnx of PREFIX.json with stand-in parameters (write_standin_params) into `out`; returns the real
    parameters' entries in PREFIX.pdiparams (file order: the stand-in value of entry k is k)."""
    entries = read_params(prefix)
    standin = out + ".standin.pdiparams"
    write_standin_params(entries, standin)
    try:
        run_paddle2onnx(prefix + ".json", standin, out, opset)
    finally:
        os.remove(standin)
    return entries
