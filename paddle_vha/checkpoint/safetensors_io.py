"""Streaming safetensors I/O with numpy: read one tensor (or a row range of it), write shards tensor by tensor.

Why not `safetensors.numpy`: it has no bfloat16, and `save_file` needs every tensor of a shard in memory at
once. The format is small (8-byte little-endian header length, a JSON header of name -> dtype, shape,
[begin, end) data offsets, then the raw little-endian bytes), so this module reads and writes it directly:
reads use plain `pread` (no mmap, so nothing counts toward RSS beyond the rows asked for) and a writer
writes its header first, from the planned shapes, then streams tensors into place.

Casts to bfloat16 round float64 values once (round-to-nearest-even); see `cast`.
"""
from __future__ import annotations

import json
import math
import os
import re
import struct
import sys
from dataclasses import dataclass
from typing import Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

import ml_dtypes
import numpy as np

__all__ = [
    "DTYPES",
    "TensorRef",
    "SafetensorsFormatError",
    "ShardWriter",
    "cast",
    "cast_finite",
    "dtype_code",
    "dtype_name",
    "parse_size",
    "plan_shards",
    "read_header",
    "read_rows",
    "read_tensor",
    "row_chunks",
    "shard_name",
    "to_float32",
    "to_float64",
    "write_index",
]

# safetensors dtype code -> numpy dtype (bfloat16 from ml_dtypes).
DTYPES: Dict[str, np.dtype] = {
    "F64": np.dtype(np.float64),
    "F32": np.dtype(np.float32),
    "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "I64": np.dtype(np.int64),
    "I32": np.dtype(np.int32),
    "I16": np.dtype(np.int16),
    "I8": np.dtype(np.int8),
    "U8": np.dtype(np.uint8),
    "BOOL": np.dtype(np.bool_),
}
FLOAT_CODES = ("F64", "F32", "F16", "BF16")
_NAMES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16"}
_MAX_HEADER = 100 * 1024 * 1024  # the safetensors library's own limit
if sys.byteorder != "little":  # reads and writes use native-order numpy views of little-endian bytes
    raise ImportError("paddle_vha.safetensors_io supports little-endian machines only")


class SafetensorsFormatError(ValueError):
    """A safetensors file whose header or data layout is broken; one line naming the file."""


def dtype_name(code: str) -> str:
    """'BF16' -> 'bfloat16' (the names config.json and the CLI use)."""
    return _NAMES.get(code, code.lower())


def dtype_code(name: str) -> str:
    """'bfloat16' -> 'BF16'."""
    for code, n in _NAMES.items():
        if n == name:
            return code
    raise ValueError(f"unsupported dtype {name!r} (expected one of {', '.join(_NAMES.values())})")


@dataclass(frozen=True)
class TensorRef:
    """Where one tensor's bytes live: file, dtype code, shape and absolute [start, end) byte offsets."""

    name: str
    path: str
    dtype: str
    shape: Tuple[int, ...]
    start: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.start

    @property
    def row_bytes(self) -> int:
        """Bytes of one index along axis 0 (the whole tensor for a scalar)."""
        return self.nbytes // self.shape[0] if self.shape and self.shape[0] else self.nbytes


def _no_duplicate_keys(pairs):
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        dup = sorted({k for k in keys if keys.count(k) > 1})
        raise ValueError(f"duplicate name(s) in the header: {', '.join(dup[:3])}")
    return dict(pairs)


def _is_count(x) -> bool:
    """A JSON integer >= 0 (not a bool, a float such as 64.5 or 64.0, or a string)."""
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def _metadata(path: str, meta) -> dict:
    """__metadata__ as the safetensors library takes it: absent, or an object of string values."""
    if meta is None:
        return {}
    if not (isinstance(meta, dict) and all(isinstance(v, str) for v in meta.values())):
        raise SafetensorsFormatError(f"{path}: __metadata__ must be an object of strings, got {type(meta).__name__}")
    return meta


def _entry(path: str, name: str, info):
    """(dtype code, shape, (start, end)) of one header entry: an object with dtype / shape / data_offsets, integer
    shape and offsets (what the safetensors library accepts); SafetensorsFormatError naming the entry otherwise."""
    def bad(why):
        return SafetensorsFormatError(f"{path}: malformed header entry for {name!r} ({why})")

    if not isinstance(info, dict) or not {"dtype", "shape", "data_offsets"} <= set(info):
        raise bad("expected an object with dtype, shape and data_offsets")
    shape, offsets = info["shape"], info["data_offsets"]
    if not (isinstance(shape, list) and all(_is_count(s) for s in shape)):
        raise bad(f"shape {shape!r} is not a list of non-negative integers")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_count(o) for o in offsets)):
        raise bad(f"data_offsets {offsets!r} is not two non-negative integers")
    if not isinstance(info["dtype"], str):
        raise bad(f"dtype {info['dtype']!r} is not a string")
    return info["dtype"], tuple(shape), tuple(offsets)


def read_header(path: str) -> Tuple[dict, Dict[str, TensorRef]]:
    """(metadata, name -> TensorRef) of one safetensors file, checked as the safetensors library checks it: a JSON
    object without duplicate names, a known dtype and a size matching its shape for every tensor, and data offsets
    that tile the data section exactly (no overlap, no gap, nothing after the last tensor)."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise SafetensorsFormatError(f"{path}: truncated safetensors file ({size} bytes)")
        (n,) = struct.unpack("<Q", head)
        if n > _MAX_HEADER or 8 + n > size:
            raise SafetensorsFormatError(f"{path}: header length {n} does not fit a {size}-byte file")
        try:
            header = json.loads(f.read(n), object_pairs_hook=_no_duplicate_keys)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise SafetensorsFormatError(f"{path}: header is not valid JSON ({e})") from None
        except ValueError as e:
            raise SafetensorsFormatError(f"{path}: {e}") from None
    if not isinstance(header, dict):
        raise SafetensorsFormatError(f"{path}: header is not a JSON object")
    meta = _metadata(path, header.pop("__metadata__", None))
    base = 8 + n
    refs: Dict[str, TensorRef] = {}
    for name, info in header.items():
        code, shape, (a, b) = _entry(path, name, info)
        if code not in DTYPES:
            raise SafetensorsFormatError(f"{path}: tensor {name!r} has unsupported dtype {code}")
        want = math.prod(shape) * DTYPES[code].itemsize
        if not (0 <= a <= b and b - a == want and base + b <= size):
            raise SafetensorsFormatError(
                f"{path}: tensor {name!r} data offsets [{a}, {b}) do not hold {list(shape)} {code} "
                f"({want} bytes) inside the {size}-byte file"
            )
        refs[name] = TensorRef(name, path, code, shape, base + a, base + b)
    end = base
    for ref in sorted(refs.values(), key=lambda r: (r.start, r.end)):
        if ref.start != end:
            what = "overlaps the tensor before it" if ref.start < end else f"leaves a {ref.start - end}-byte gap before it"
            raise SafetensorsFormatError(f"{path}: tensor {ref.name!r} at data offset {ref.start - base} {what}")
        end = ref.end
    if end != size:
        raise SafetensorsFormatError(f"{path}: {size - end} bytes after the last tensor's data")
    return meta, refs


def read_rows(ref: TensorRef, start: int = 0, stop: Optional[int] = None) -> np.ndarray:
    """Rows [start, stop) along axis 0 of a tensor, as a fresh numpy array in its stored dtype."""
    if not ref.shape:
        start, stop, shape = 0, 1, ()
    else:
        stop = ref.shape[0] if stop is None else stop
        shape = (stop - start,) + ref.shape[1:]
    nbytes = (stop - start) * ref.row_bytes
    buf = np.empty(nbytes, np.uint8)  # uninitialised: filled by readinto below
    with open(ref.path, "rb", buffering=0) as f:
        f.seek(ref.start + start * ref.row_bytes)
        view, got = memoryview(buf), 0
        while got < nbytes:
            k = f.readinto(view[got:])
            if not k:
                raise SafetensorsFormatError(f"{ref.path}: unexpected end of file reading {ref.name!r}")
            got += k
    return buf.view(DTYPES[ref.dtype]).reshape(shape)


def read_tensor(ref: TensorRef) -> np.ndarray:
    """The whole tensor in its stored dtype."""
    return read_rows(ref)


def row_chunks(ref: TensorRef, max_bytes: int) -> Iterator[Tuple[int, int]]:
    """[start, stop) row ranges of at most max_bytes each (at least one row) covering the tensor."""
    rows = ref.shape[0] if ref.shape else 1
    step = max(1, max_bytes // max(ref.row_bytes, 1))
    for a in range(0, rows, step):
        yield a, min(rows, a + step)
    if rows == 0:
        yield 0, 0


def _f64_to_bf16(x: np.ndarray, block: int = 1 << 18) -> np.ndarray:
    """Round float64 to bfloat16 once, to nearest-even.

    ml_dtypes converts float64 -> float32 -> bfloat16, which can round twice (1 + 2^-8 + 2^-30 -> 1.0).
    Rounding to float32 *to odd* first (truncate toward zero, then set the last bit if anything was dropped)
    keeps enough information for the second rounding, float32 -> bfloat16 to nearest-even on the bit
    pattern, to give the correctly rounded result. Done in cache-sized blocks with integer ops.
    """
    x = np.ascontiguousarray(x, np.float64)
    flat, out = x.reshape(-1), np.empty(x.size, np.uint16)
    for a in range(0, flat.size, block):
        xb = flat[a: a + block]
        with np.errstate(over="ignore", invalid="ignore"):
            y = xb.astype(np.float32)  # nearest-even
            back = y.astype(np.float64)
            away = np.abs(back) > np.abs(xb)  # rounded away from zero (never for 0, inf or nan)
            inexact = back != xb
        u = y.view(np.uint32) - away.view(np.uint8).astype(np.uint32)  # truncate: one ulp toward zero
        u |= inexact.view(np.uint8).astype(np.uint32) & ~np.isnan(xb).view(np.uint8).astype(np.uint32)  # sticky
        bf = (u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)  # nearest-even
        out[a: a + block] = np.where(np.isnan(xb), np.uint32(0x7FC0), bf).astype(np.uint16)
    return out.view(ml_dtypes.bfloat16).reshape(x.shape)


def to_float32(x: np.ndarray) -> np.ndarray:
    """x as float32: exact for bfloat16 (widened by a bit shift, not ml_dtypes' slow cast) and float16; float64 is
    rounded."""
    if x.dtype == DTYPES["BF16"]:
        return (x.view(np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)  # bf16 = top half of f32
    return x.astype(np.float32)


def to_float64(x: np.ndarray) -> np.ndarray:
    """x as float64 (exact for every stored float dtype)."""
    return (to_float32(x) if x.dtype == DTYPES["BF16"] else x).astype(np.float64)


def cast(x: np.ndarray, code: str) -> np.ndarray:
    """x in the dtype of safetensors code `code`, rounded once (float64 -> bfloat16 included)."""
    target = DTYPES[code]
    if x.dtype == target:
        return x
    if code == "BF16" and x.dtype == np.float64:
        return _f64_to_bf16(x)
    return x.astype(target)


def cast_finite(x: np.ndarray, code: str, name: str) -> np.ndarray:
    """cast(x, code) for a tensor written to a checkpoint: ValueError (one line naming the tensor) if x holds a NaN or
    Inf, or if the cast overflows (a finite value that `code` cannot hold becomes Inf)."""
    if x.dtype == DTYPES["BF16"]:
        bad = int(x.size - np.isfinite(to_float32(x)).sum())
    else:
        bad = int(x.size - np.isfinite(x).sum()) if x.dtype.kind == "f" else 0
    if bad:
        raise ValueError(f"{name}: {bad} non-finite value(s) (NaN or Inf)")
    with np.errstate(over="ignore"):  # overflow is reported below, by tensor
        out = cast(x, code)
    if out is not x and out.dtype != x.dtype:
        over = int(out.size - np.isfinite(to_float32(out) if code == "BF16" else out).sum())
        if over:
            biggest = float(np.abs(to_float64(x) if x.dtype == DTYPES["BF16"] else x).max())
            raise ValueError(f"{name}: {over} value(s) overflow {dtype_name(code)} (largest |x| = {biggest:.3g})")
    return out


def parse_size(text) -> int:
    """'5GB' -> 5e9 bytes, '200MB', '20KB', '1GiB', or an int; ValueError (one line) for anything else, including
    sizes that are not finite, not positive, or beyond 2**62 bytes."""
    if isinstance(text, int) and not isinstance(text, bool):
        value = text
    else:
        s = str(text).strip().upper().replace(" ", "")
        units = {"TIB": 2**40, "GIB": 2**30, "MIB": 2**20, "KIB": 2**10, "TB": 10**12, "GB": 10**9, "MB": 10**6,
                 "KB": 10**3, "B": 1}
        number, mult = s, 1
        for u, m in units.items():
            if s.endswith(u):
                number, mult = s[: -len(u)], m
                break
        try:
            x = float(number) * mult
        except ValueError:
            raise ValueError(f"cannot parse size {text!r} (examples: 5GB, 500MB, 20KB)") from None
        if not math.isfinite(x) or x > 2**62:
            raise ValueError(f"size {text!r} is too large")
        value = int(x)
    if value <= 0:
        raise ValueError(f"size {text!r} must be positive")
    return value


class ShardWriter:
    """Write one safetensors file tensor by tensor: the header comes first, from the planned specs.

    specs: (name, dtype code, shape) in file order. Call `write(name, rows)` with consecutive row blocks of
    each tensor, in spec order; `close()` checks that every byte was written.
    """

    def __init__(self, path: str, specs: Sequence[Tuple[str, str, Tuple[int, ...]]], metadata: Optional[dict] = None):
        self.path = path
        header: dict = {"__metadata__": dict(metadata or {"format": "pt"})}
        offset = 0
        self._order: List[Tuple[str, str, Tuple[int, ...], int]] = []
        for name, code, shape in specs:
            nbytes = math.prod(shape) * DTYPES[code].itemsize
            header[name] = {"dtype": code, "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
            self._order.append((name, code, tuple(shape), nbytes))
            offset += nbytes
        self.data_bytes = offset
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)  # pad so tensor data starts 8-byte aligned, as the reference writer does
        self._f = open(path, "wb")
        self._f.write(struct.pack("<Q", len(raw)) + raw)
        self._i, self._done = 0, 0  # current tensor, bytes of it written

    def write(self, name: str, rows: np.ndarray) -> None:
        if self._i >= len(self._order):
            raise ValueError(f"{self.path}: write of {name!r} after the last planned tensor")
        want_name, code, shape, nbytes = self._order[self._i]
        if name != want_name:
            raise ValueError(f"{self.path}: expected tensor {want_name!r} next, got {name!r}")
        if rows.dtype != DTYPES[code]:
            raise ValueError(f"{self.path}: {name!r} planned as {code}, got {rows.dtype}")
        if tuple(rows.shape[1:]) != shape[1:] and shape:
            raise ValueError(f"{self.path}: {name!r} rows of shape {list(rows.shape)} do not fit {list(shape)}")
        data = np.ascontiguousarray(rows)  # native order; safetensors is little-endian (checked at import)
        self._f.write(data.reshape(-1).view(np.uint8))
        self._done += data.nbytes
        if self._done > nbytes:
            raise ValueError(f"{self.path}: {name!r} got {self._done} bytes, planned {nbytes}")
        if self._done == nbytes:
            self._i, self._done = self._i + 1, 0

    def close(self) -> None:
        complete = self._i == len(self._order) and self._done == 0
        self._f.close()
        if not complete:
            raise ValueError(f"{self.path}: closed before all planned tensors were written")

    def abort(self) -> None:
        self._f.close()


def write_index(path: str, weight_map: Dict[str, str], total_size: int) -> None:
    """model.safetensors.index.json: {"metadata": {"total_size": ...}, "weight_map": {name: file}}."""
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"metadata": {"total_size": total_size}, "weight_map": weight_map}, f, indent=2)
        f.write("\n")


def plan_shards(specs: Iterable[Tuple[str, str, Tuple[int, ...]]], max_shard_bytes: int) -> List[list]:
    """Split specs, in order, into shards of at most max_shard_bytes (a larger single tensor gets its own)."""
    shards: List[list] = [[]]
    used = 0
    for spec in specs:
        nbytes = math.prod(spec[2]) * DTYPES[spec[1]].itemsize
        if shards[-1] and used + nbytes > max_shard_bytes:
            shards.append([])
            used = 0
        shards[-1].append(spec)
        used += nbytes
    return shards


def natural_key(name: str):
    """Sort key that orders layers.2 before layers.10."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def shard_name(k: int, n: int) -> str:
    """Hugging Face's shard naming: model-00001-of-00003.safetensors (k counts from 1)."""
    return f"model-{k:05d}-of-{n:05d}.safetensors"
