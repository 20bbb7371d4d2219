"""Seeded mutations of valid input files, for the fuzz tests (tests/test_fuzz_inputs.py): a GGUF file mutated field by
field from its own layout, and a checkpoint folder's JSON files (config.json, tokenizer.json, generation_config.json)
and safetensors headers mutated value by value. Imports nothing from paddle_vha: the GGUF layout is restated here from
the format's specification (ggml's docs/gguf.md, version 3), little-endian:

    header   magic "GGUF", u32 version, u64 tensor_count, u64 kv_count
    kv       string key, u32 value_type, value          string = u64 length + UTF-8 bytes
    value    by type: 0 u8, 1 i8, 2 u16, 3 i16, 4 u32, 5 i32, 6 f32, 7 bool, 8 string, 10 u64, 11 i64, 12 f64,
             9 array = u32 item type, u64 count, items
    tensor   string name, u32 n_dims, u64 dims[n_dims], u32 ggml type, u64 offset (from the aligned data start)
"""
from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from typing import List

import numpy as np

SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


@dataclass(frozen=True)
class Field:
    """One field of a GGUF header: byte offset, struct format, what it is (count, strlen, vtype, atype, value, ndims,
    dim, ttype, toffset, version, text) and a label for the report."""

    at: int
    fmt: str
    kind: str
    label: str

    @property
    def size(self) -> int:
        return struct.calcsize(self.fmt) if self.kind != "text" else int(self.fmt)


def gguf_fields(data: bytes) -> List[Field]:
    """Every field of a valid GGUF header, in file order (the file must parse: it is the test's own)."""
    out: List[Field] = []
    pos = 0

    def take(fmt, kind, label):
        nonlocal pos
        out.append(Field(pos, fmt, kind, label))
        (v,) = struct.unpack_from(fmt, data, pos)
        pos += struct.calcsize(fmt)
        return v

    def string(label):
        nonlocal pos
        n = take("<Q", "strlen", label + " length")
        out.append(Field(pos, str(n), "text", label))
        s = data[pos:pos + n].decode()
        pos += n
        return s

    def value(vtype, label):
        nonlocal pos
        if vtype == 8:
            string(label)
        elif vtype == 9:
            atype = take("<I", "atype", label + " item type")
            count = take("<Q", "count", label + " count")
            for i in range(count):
                value(atype, f"{label}[{i}]")
        else:
            take(SCALARS[vtype], "value", label)

    assert data[:4] == b"GGUF"
    pos = 4
    take("<I", "version", "version")
    n_tensors = take("<Q", "count", "tensor_count")
    n_kv = take("<Q", "count", "kv_count")
    for _ in range(n_kv):
        key = string("key")
        vtype = take("<I", "vtype", f"{key} type")
        value(vtype, key)
    for _ in range(n_tensors):
        name = string("tensor name")
        n_dims = take("<I", "ndims", f"{name} n_dims")
        for d in range(n_dims):
            take("<Q", "dim", f"{name} dim {d}")
        take("<I", "ttype", f"{name} type")
        take("<Q", "toffset", f"{name} offset")
    return out


def _boundary(rng, fmt: str, old):
    """A boundary or random value for a field of struct format `fmt` whose value was `old`."""
    if fmt == "<f" or fmt == "<d":
        return float(rng.choice([0.0, -0.0, -1.0, math.nan, math.inf, -math.inf, 1e30, -1e-30, 3.4e38, old * -1,
                                 old * 1e6]))
    if fmt == "<?":
        return bool(rng.integers(2))
    bits = struct.calcsize(fmt) * 8
    signed = fmt[1].islower()
    lo, hi = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)
    old = int(old)
    picks = [0, 1, old - 1, old + 1, old * 2, old + 1000, hi, lo, hi // 2 + 1, (1 << 31) - 1, 1 << 31,
             int(rng.integers(0, 1 << 62)) if bits == 64 else int(rng.integers(0, 1 << min(bits, 62)))]
    if fmt == "<I" or fmt == "<i":
        picks += list(range(14)) + [30, 31, 39, 255]  # GGUF value types and ggml tensor types, in and out of range
    v = picks[int(rng.integers(len(picks)))]  # by index: numpy would turn 2**64 - 1 into a float
    return min(max(v, lo), hi)


def mutate_gguf(data: bytes, fields: List[Field], rng) -> (bytes, str):
    """One mutation of a valid GGUF: (new bytes, what was done)."""
    buf = bytearray(data)
    header_end = fields[-1].at + fields[-1].size
    how = rng.choice(["field", "field", "field", "text", "flip", "truncate", "splice"])
    if how == "field":
        f = fields[int(rng.choice([i for i, f in enumerate(fields) if f.kind != "text"]))]
        (old,) = struct.unpack_from(f.fmt, data, f.at)
        new = _boundary(rng, f.fmt, old)
        struct.pack_into(f.fmt, buf, f.at, new)
        return bytes(buf), f"{f.label} ({f.kind}) {old!r} -> {new!r}"
    if how == "text":
        texts = [f for f in fields if f.kind == "text" and f.size]
        f = texts[int(rng.integers(len(texts)))]
        i = f.at + int(rng.integers(f.size))
        buf[i] = int(rng.choice([0, 0x80, 0xFF, ord("."), ord("0"), int(rng.integers(256))]))
        return bytes(buf), f"{f.label}: byte {i - f.at} -> {buf[i]:#x}"
    if how == "flip":
        k = int(rng.integers(1, 9))
        at = rng.integers(4, header_end, size=k)
        for i in at:
            buf[int(i)] ^= 1 << int(rng.integers(8))
        return bytes(buf), f"{k} bit flips in the header at {sorted(int(i) for i in at)}"
    if how == "truncate":
        cut = int(rng.integers(4, len(data)))
        return bytes(buf[:cut]), f"truncated to {cut} of {len(data)} bytes"
    # splice: a header span copied over another (a count read as a string length, a type as a dimension, ...)
    a, b = sorted(int(x) for x in rng.integers(4, header_end, size=2))
    n = int(rng.integers(1, 17))
    buf[b:b + n] = data[a:a + n]
    return bytes(buf[:len(data)]), f"{n} bytes from {a} copied over {b}"


# JSON files: values replaced by other JSON values of other types and ranges, keys removed, the text cut
WEIRD = [None, True, False, 0, -1, 1.5, 1e308, -1e308, float("nan"), 10 ** 30, "", "x" * 200, "\udcff", [], {},
         [1, 2], {"a": 1}, [[[[[]]]]], 2 ** 63, "1", "NaN"]


def _paths(obj, prefix=()):
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield prefix + (k,)
            yield from _paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj[:50]):  # a vocabulary's first entries are enough
            yield prefix + (i,)
            yield from _paths(v, prefix + (i,))


def mutate_json(text: str, rng) -> (str, str):
    """One mutation of a JSON document's text: (new text, what was done)."""
    how = rng.choice(["value", "value", "value", "drop", "cut", "bytes"])
    if how == "cut":
        k = int(rng.integers(0, len(text)))
        return text[:k], f"cut at {k} of {len(text)} characters"
    if how == "bytes":
        k = int(rng.integers(0, len(text)))
        return text[:k] + rng.choice(["\x00", "\ufffd", "}", "]", ",", '"', "\\"]) + text[k + 1:], f"character {k}"
    obj = json.loads(text)
    paths = list(_paths(obj))
    if not paths:
        return json.dumps(WEIRD[int(rng.integers(len(WEIRD)))]), "the whole document replaced"
    path = paths[int(rng.integers(len(paths)))]
    parent = obj
    for p in path[:-1]:
        parent = parent[p]
    if how == "drop" and isinstance(parent, dict):
        del parent[path[-1]]
        return json.dumps(obj), f"removed {'/'.join(map(str, path))}"
    new = WEIRD[int(rng.integers(len(WEIRD)))]
    parent[path[-1]] = new
    return json.dumps(obj, ensure_ascii=bool(rng.integers(2))), f"{'/'.join(map(str, path))} -> {new!r:.40}"


def mutate_safetensors(data: bytes, rng) -> (bytes, str):
    """One mutation of a safetensors file: its 8-byte header length, its JSON header (as mutate_json), or the file
    cut."""
    (n,) = struct.unpack_from("<Q", data, 0)
    how = rng.choice(["length", "header", "header", "cut"])
    if how == "length":
        picks = [0, 1, max(n - 1, 0), n + 1, len(data), 1 << 40, (1 << 64) - 1]
        new = picks[int(rng.integers(len(picks)))]
        return struct.pack("<Q", new) + data[8:], f"header length {n} -> {new}"
    if how == "cut":
        k = int(rng.integers(0, len(data)))
        return data[:k], f"cut at {k} of {len(data)} bytes"
    header, what = mutate_json(data[8:8 + n].decode(), rng)
    raw = header.encode("utf-8", "surrogatepass")
    return struct.pack("<Q", len(raw)) + raw + data[8 + n:], "header: " + what


def rng_for(seed: int, case: int):
    return np.random.default_rng([seed, case])
