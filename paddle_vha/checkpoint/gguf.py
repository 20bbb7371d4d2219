"""Reading a GGUF file (llama.cpp's format) one tensor at a time: the `gguf` package parses the header, this module
reads each tensor's bytes with pread and dequantizes them with `gguf.quants`.

    gf = GGUFFile.open("model.gguf")     # header, metadata and tensor table; no tensor data; one-line GGUFError
    gf.arch, gf.meta("llama.block_count")
    gf.tensors["blk.0.attn_q.weight"]    # GGUFTensor: type, shape in numpy order ([out, in] for a weight), bytes
    gf.read("blk.0.attn_q.weight")       # float32 numpy, dequantized

Why not the reader's own arrays: GGUFReader memory-maps the whole file, and every page a tensor view touches counts
toward the process's resident memory; reading each tensor with pread keeps the import's peak at one tensor. Types
read: the float types, the legacy block quants and the K-quants (SUPPORTED), all dequantized by `gguf.quants`.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

import numpy as np

from .contract import CheckpointError, file_problem
from .gguf_header import check_header

__all__ = ["GGUFError", "GGUFFile", "GGUFTensor", "SUPPORTED", "bits_per_weight"]

# GGML tensor types the importer dequantizes (gguf.quants): float, legacy 32-element blocks, 256-element K-quants.
SUPPORTED = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")
MAGIC = b"GGUF"


class GGUFError(CheckpointError):
    """A GGUF file that cannot be read, or holds something the importer does not take; one line naming the file."""


@dataclass(frozen=True)
class GGUFTensor:
    """One tensor of the file: GGML type name, numpy-order shape (GGUF lists dims innermost first), absolute byte
    range of its data."""

    name: str
    type: str
    shape: Tuple[int, ...]
    start: int
    nbytes: int

    @property
    def elements(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) if self.shape else 1


def bits_per_weight(type_name: str) -> float:
    """Storage bits per weight of a GGML type, scales included (Q4_0: 4.5, Q4_1: 5.0, Q8_0: 8.5, Q4_K: 4.5)."""
    import gguf

    block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[type_name]]
    return 8.0 * size / block


def _wrong(value, kind) -> bool:
    return not isinstance(value, kind) or (isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple)
                                                                                    else (kind,)))


def _kind(value) -> str:
    name = {str: "a string", bool: "a boolean", int: "an integer", float: "a number", list: "a list"}
    return name.get(type(value), type(value).__name__)


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


class GGUFFile:
    """The header of one GGUF file (see the module docstring). `meta(key)` gives a metadata value as Python (str, int,
    float, bool, list)."""

    def __init__(self, path: str):
        self.path = str(path)
        problem = file_problem(self.path)
        if problem:
            raise GGUFError(f"{self.path}: cannot read the GGUF file (it is {problem})")
        self.size = os.path.getsize(self.path)
        with open(self.path, "rb") as f:
            head = f.read(4)
        if head != MAGIC:
            raise GGUFError(f"{self.path}: not a GGUF file (it starts with {head!r}, not {MAGIC!r})")
        import gguf

        check_header(self.path, GGUFError)  # counts, lengths and types against the bytes left, before the reader
        try:
            reader = gguf.GGUFReader(self.path)
        except (ValueError, IndexError, KeyError, OverflowError, MemoryError) as e:
            # the reader reshapes each tensor's bytes from the map: a short file fails there, in numpy's words
            raise GGUFError(f"{self.path}: truncated or malformed GGUF file ({self.size} bytes; the gguf reader says: "
                            f"{str(e).splitlines()[0][:160] if str(e) else type(e).__name__})") from None
        self._fields = reader.fields
        self.version = self.meta("GGUF.version")
        self.tensors: Dict[str, GGUFTensor] = {}
        for t in reader.tensors:
            ref = GGUFTensor(t.name, t.tensor_type.name, tuple(int(d) for d in reversed(t.shape.tolist())),
                             int(t.data_offset), int(t.n_bytes))
            if ref.start + ref.nbytes > self.size:
                raise GGUFError(f"{self.path}: truncated GGUF file: tensor {t.name} ends at byte "
                                f"{ref.start + ref.nbytes}, the file has {self.size}")
            self.tensors[t.name] = ref
        del reader  # drops the map; reads go through pread

    @classmethod
    def open(cls, path) -> "GGUFFile":
        return path if isinstance(path, GGUFFile) else cls(os.fspath(path))

    def __repr__(self) -> str:
        return f"GGUFFile({self.path!r})"

    @property
    def arch(self) -> Optional[str]:
        return self.meta("general.architecture")

    def has(self, key: str) -> bool:
        return key in self._fields

    def meta(self, key: str, default=None):
        """The metadata value under `key` (arrays as lists), or `default` if absent."""
        field = self._fields.get(key)
        if field is None:
            return default
        try:
            value = field.contents()
        except (ValueError, IndexError, UnicodeDecodeError) as e:
            raise GGUFError(f"{self.path}: metadata {key} cannot be read ({e})") from None
        return value

    def typed(self, key: str, kind, what: str, default=None):
        """meta(key) checked to be of `kind` (a type or tuple; bool is never an int here), else GGUFError naming the
        key, the value and `what` it should be ("a string", "a number"). A list `kind` ((list, str)) checks a list and
        every item."""
        value = self.meta(key)
        if value is None:
            return default
        listed = isinstance(kind, tuple) and kind[:1] == (list,)
        if listed and isinstance(value, list):
            bad = next((v for v in value if _wrong(v, kind[1])), None)
            if bad is None:
                return value
            raise GGUFError(f"{self.path}: metadata {key} holds {_kind(bad)} ({_short(bad)}), not {what}")
        if listed or _wrong(value, kind):
            raise GGUFError(f"{self.path}: metadata {key} = {_short(value)} is {_kind(value)}, not {what}")
        return value

    def keys(self):
        return list(self._fields)

    def read_raw(self, name: str) -> np.ndarray:
        """The tensor's stored bytes (uint8), read with pread."""
        ref = self.tensors[name]
        buf = np.empty(ref.nbytes, np.uint8)
        with open(self.path, "rb", buffering=0) as f:
            view, got = memoryview(buf), 0
            while got < ref.nbytes:
                k = os.preadv(f.fileno(), [view[got:]], ref.start + got)
                if not k:
                    raise GGUFError(f"{self.path}: truncated GGUF file: tensor {name} ends past byte {self.size}")
                got += k
        return buf

    def read(self, name: str) -> np.ndarray:
        """The tensor as float32 numpy in numpy order, dequantized by gguf.quants; GGUFError for a type outside
        SUPPORTED."""
        import gguf

        ref = self.tensors[name]
        if ref.type not in SUPPORTED:
            raise GGUFError(f"{self.path}: tensor {name} is {ref.type}, which the importer does not read (it reads "
                            f"{', '.join(SUPPORTED)})")
        qtype = gguf.GGMLQuantizationType[ref.type]
        raw = self.read_raw(name)
        block, size = gguf.GGML_QUANT_SIZES[qtype]
        rows = ref.elements // ref.shape[-1] if ref.shape else 1
        if ref.shape and ref.shape[-1] % block:
            raise GGUFError(f"{self.path}: tensor {name} rows of {ref.shape[-1]} do not split into {ref.type} blocks "
                            f"of {block}")
        # (rows, bytes per row) -> (rows, row length): blocks never straddle rows
        with np.errstate(all="ignore"):  # a NaN / Inf block scale: counted and refused by the caller, in one line
            out = gguf.quants.dequantize(raw.reshape(rows, -1), qtype)
        return np.asarray(out, dtype=np.float32).reshape(ref.shape)
