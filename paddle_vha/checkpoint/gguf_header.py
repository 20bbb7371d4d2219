"""A GGUF file's header walked before any parser builds anything from it: every count, length, type and dimension
checked against the bytes the file has left, so that a corrupt count is refused in one line instead of becoming
millions of objects (the `gguf` package's reader turned a 268-item array whose item type was flipped to "array" into
3.5 GB of views). Layout (ggml's docs/gguf.md, versions 2 and 3, little-endian):

    magic "GGUF", u32 version, u64 tensor_count, u64 kv_count
    kv       string key, u32 value type, value          string = u64 length + bytes
    value    0 u8, 1 i8, 2 u16, 3 i16, 4 u32, 5 i32, 6 f32, 7 bool, 8 string, 9 array, 10 u64, 11 i64, 12 f64;
             array = u32 item type, u64 count, items
    tensor   string name, u32 n_dims, u64 dims[n_dims], u32 ggml type, u64 offset
"""
from __future__ import annotations

import mmap
import struct

from .contract import CheckpointError

__all__ = ["check_header", "MAX_DIMS"]

MAX_DIMS = 4  # GGML_MAX_DIMS
_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}  # fixed-size value types
_STRING, _ARRAY = 8, 9
_MIN_SIZE = {**_SIZES, _STRING: 8, _ARRAY: 12}  # the fewest bytes one value of each type takes
_MAX_NESTING = 4


class _Bad(Exception):
    pass


def check_header(path: str, error=CheckpointError) -> None:
    """`error` (one line naming the field and its byte offset) for a header whose counts, lengths, types or dims
    cannot be what the file holds; nothing is built from the values."""
    with open(path, "rb") as f:
        try:
            data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError:  # an empty file
            raise error(f"{path}: truncated GGUF file (0 bytes)") from None
    try:
        _walk(data)
    except _Bad as e:
        raise error(f"{path}: truncated or malformed GGUF file ({len(data):,} bytes; its header: {e})") from None
    finally:
        data.close()


def _walk(data) -> None:
    size = len(data)
    pos = 4

    def take(fmt: str, what: str):
        nonlocal pos
        n = struct.calcsize(fmt)
        if pos + n > size:
            raise _Bad(f"{what} at byte {pos} runs past the end of the file ({size} bytes)")
        (v,) = struct.unpack_from(fmt, data, pos)
        pos += n
        return v

    def count(what: str, each: int) -> int:
        n = take("<Q", what)
        if n * each > size - pos:
            raise _Bad(f"{what} {n:,} at byte {pos - 8} needs at least {n * each:,} more bytes; the file has "
                       f"{size - pos:,} left")
        return n

    def string(length: str) -> str:
        """The string whose u64 length `length` names, read (a key, a tensor name)."""
        nonlocal pos
        n = count(length, 1)
        pos += n
        return bytes(data[pos - n:pos]).decode("utf-8", "replace")

    def value(kind: int, what: str, depth: int) -> None:
        nonlocal pos
        if kind in _SIZES:
            if pos + _SIZES[kind] > size:
                raise _Bad(f"{what} at byte {pos} runs past the end of the file")
            pos += _SIZES[kind]
        elif kind == _STRING:
            n = count(f"{what}'s length", 1)  # skipped: no string is built for a value
            pos += n
        elif kind == _ARRAY:
            if depth >= _MAX_NESTING:
                raise _Bad(f"{what}: arrays nested more than {_MAX_NESTING} deep")
            item = take("<I", f"{what}'s item type")
            if item not in _MIN_SIZE:
                raise _Bad(f"{what}'s item type {item} at byte {pos - 4} is not a GGUF value type (0-12)")
            n = count(f"{what}'s item count", _MIN_SIZE[item])
            if item in _SIZES:
                pos += n * _SIZES[item]
            else:
                for i in range(n):
                    value(item, f"{what}[{i}]", depth + 1)
        else:
            raise _Bad(f"{what}'s value type {kind} at byte {pos - 4} is not a GGUF value type (0-12)")

    version = take("<I", "version")
    if version not in (2, 3):
        raise _Bad(f"version {version}: this importer reads GGUF versions 2 and 3")
    tensors = count("tensor count", 24)  # a name's length, n_dims, type and offset at the least
    kvs = count("metadata count", 12)  # a key's length and a value type at the least
    for k in range(kvs):
        key = string(f"metadata entry {k}'s key length")
        kind = take("<I", f"metadata {key!r:.60}'s value type")
        value(kind, f"metadata {key!r:.60}", 0)
    for t in range(tensors):
        name = string(f"tensor {t}'s name length")
        dims = take("<I", f"tensor {name!r:.60}'s n_dims")
        if not 1 <= dims <= MAX_DIMS:
            raise _Bad(f"tensor {name!r:.60} has {dims} dimensions (GGML tensors have 1 to {MAX_DIMS})")
        elements = 1
        for d in range(dims):
            extent = take("<Q", f"tensor {name!r:.60}'s dim {d}")
            elements *= extent
            if extent == 0 or elements > size * 8:  # at least one bit a weight: more cannot be in the file
                raise _Bad(f"tensor {name!r:.60} dim {d} = {extent:,}: the file ({size:,} bytes) cannot hold it")
        take("<I", f"tensor {name!r:.60}'s type")
        take("<Q", f"tensor {name!r:.60}'s offset")
