"""What every decoder session shares: building one call's inputs, the empty cache, prefill and step."""
from __future__ import annotations

import os
from typing import List, Optional, Tuple

import numpy as np

from ..checkpoint.contract import read_json_object
from .kv_cache import CacheSlot, float_slots

__all__ = ["DecoderSession", "CacheBuffers", "decoder_feeds", "ServeError", "read_export_info", "per_cache_input"]


class ServeError(ValueError):
    """An export folder a session cannot serve; the message is one line naming the problem."""


def _positive_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 1


def read_export_info(export_dir: str) -> dict:
    """export_info.json of an export folder, checked: the fields the sessions and tools/generate.py use, and the model
    file beside it (present, not empty). ServeError (one line) otherwise."""
    path = os.path.join(export_dir, "export_info.json")
    if not os.path.isdir(export_dir):
        raise ServeError(f"{export_dir}: not a directory")
    if not os.path.isfile(path):
        raise ServeError(f"{export_dir}: no export_info.json (write the folder with tools/export_onnx.py)")
    info = read_json_object(path, ServeError)
    for key in ("vocab_size", "num_hidden_layers"):
        if not _positive_int(info.get(key)):
            raise ServeError(f"{path}: {key} must be a positive int, got {info.get(key)!r}")
    shapes = info.get("cache_shapes")
    if not (isinstance(shapes, list) and len(shapes) == info["num_hidden_layers"]
            and all(isinstance(s, list) and len(s) == 2 and all(_positive_int(v) for v in s) for s in shapes)):
        raise ServeError(f"{path}: cache_shapes must list (heads, width) for each of the {info['num_hidden_layers']} "
                         "layers")
    windows = info.setdefault("cache_windows", [None] * info["num_hidden_layers"])  # older exports: no windows
    if not (isinstance(windows, list) and len(windows) == info["num_hidden_layers"]
            and all(w is None or _positive_int(w) for w in windows)):
        raise ServeError(f"{path}: cache_windows must give each layer's sliding window (a positive int) or null")
    names = info.setdefault("cache_names", [["key", "value"]] * info["num_hidden_layers"])  # older exports: pairs
    if not (isinstance(names, list) and len(names) == info["num_hidden_layers"]
            and all(isinstance(n, list) and n and all(isinstance(x, str) for x in n) for n in names)):
        raise ServeError(f"{path}: cache_names must list the cache tensor names of each layer")
    if info.setdefault("cache_io", "concat") not in ("concat", "buffer"):
        raise ServeError(f"{path}: cache_io must be 'concat' or 'buffer', got {info['cache_io']!r}")
    kv = info.setdefault("kv_cache", {"format": "fp32"})  # older exports: a float32 cache
    if not (isinstance(kv, dict) and kv.get("format") in ("fp32", "int8")):
        raise ServeError(f"{path}: kv_cache must say the cache format ('fp32' or 'int8'), got {kv!r}")
    model = os.path.join(export_dir, "model.onnx")
    if not os.path.isfile(model) or os.path.getsize(model) == 0:
        raise ServeError(f"{model}: missing or empty")
    return info


def decoder_feeds(ids, past_len: int, attention_mask=None):
    """(input_ids, attention_mask, position_ids) for `ids` (B, S) after `past_len` cached tokens.

    attention_mask (B, past_len + S), 1 for real tokens, 0 for padding (left padding for batched prompts);
    positions count real tokens only, so a left-padded row is rotated exactly like the same row unpadded.
    """
    ids = np.asarray(ids, np.int64)
    batch, seq = ids.shape
    if attention_mask is None:
        attention_mask = np.ones((batch, past_len + seq), np.int64)
    attention_mask = np.asarray(attention_mask, np.int64)
    if attention_mask.shape != (batch, past_len + seq):
        raise ValueError(f"attention_mask shape {attention_mask.shape} != (batch, past + seq) = {(batch, past_len + seq)}")
    position_ids = np.maximum(np.cumsum(attention_mask, axis=1) - 1, 0)[:, past_len:]
    return ids, attention_mask, np.ascontiguousarray(position_ids)


class CacheBuffers:
    """The cache of a buffer-flavour session: per cache input a buffer whose first `length` positions are filled,
    positions along its slot's axis (paddle_vha/serve/kv_cache.py; default: axis 2 of (B, heads, capacity, width)).
    A step returns a new CacheBuffers over the same buffers (grown when full)."""

    def __init__(self, buffers: List[np.ndarray], length: int, slots: Optional[List[CacheSlot]] = None):
        self.buffers, self.length = buffers, length
        self.slots = slots or [CacheSlot(b.dtype.type, (None,) + tuple(b.shape[1:2]) + (None,) + tuple(b.shape[3:]), 2)
                               for b in buffers]

    @property
    def capacity(self) -> int:
        return self.slots[0].length(self.buffers[0]) if self.buffers else 0

    @property
    def nbytes(self) -> int:
        """Bytes of the filled positions."""
        return sum(b[s.span(0, self.length)].nbytes for b, s in zip(self.buffers, self.slots))

    def filled(self) -> List[np.ndarray]:
        """The filled positions of every buffer (views)."""
        return [b[s.span(0, self.length)] for b, s in zip(self.buffers, self.slots)]

    @staticmethod
    def capacity_for(need: int, current: int = 0) -> int:
        """The capacity a buffer grows to when `need` positions do not fit in `current`: by a quarter at least (so
        copies are rare: each position is copied ~4 times over a long generation), in multiples of 64 (the slack a
        step reads stays small)."""
        return -(-max(need, current + current // 4) // 64) * 64

    def with_room(self, n: int) -> "CacheBuffers":
        """Buffers with room for n more positions: these, or larger copies (capacity_for)."""
        need = self.length + n
        if need <= self.capacity:
            return self
        cap = self.capacity_for(need, self.capacity)
        grown = []
        for b, s in zip(self.buffers, self.slots):
            g = np.zeros(s.positions_shape(b, cap), b.dtype)
            g[s.span(0, self.length)] = b[s.span(0, self.length)]
            grown.append(g)
        return CacheBuffers(grown, self.length, self.slots)


def per_cache_input(info: dict, key: str) -> list:
    """export_info's per-layer list `key`, repeated for each of the layer's cache tensors (the graph's input order)."""
    return [v for v, names in zip(info[key], info["cache_names"]) for _ in names]


def _check_cache_outputs(outputs, slots, positions: int, cache_io: str) -> None:
    """ServeError (one line) when the graph's cache outputs do not hold the positions the session's cache_io expects
    (past + new for "concat", the new ones for "buffer"): export_info.json's cache_io does not describe model.onnx."""
    for t, slot in zip(outputs, slots):
        if np.ndim(t) != 4 or slot.length(t) != positions:
            raise ServeError(f"the graph returned a cache output of shape {list(np.shape(t))} where cache_io "
                             f"{cache_io!r} (export_info.json) gives {positions} positions: export_info.json does "
                             "not describe this model.onnx (re-export the folder)")


class DecoderSession:
    """Subclasses set cache_shapes ((heads, width) of every cache input, in order: a float32 cache (batch, heads,
    positions, width)) or cache_slots (paddle_vha/serve/kv_cache.py: any cache's tensors, the int8 cache's included),
    optionally cache_windows (the sliding window of each cache input's layer, None for full attention) and cache_io
    ("concat": the cache is a list of arrays, present = past + new; "buffer": the cache is a CacheBuffers the session
    fills in place), and implement _run(list of input arrays) -> outputs."""

    cache_shapes: List[Tuple[int, int]]
    cache_windows: List[Optional[int]] = []
    cache_io: str = "concat"
    _cache_slots: Optional[List[CacheSlot]] = None

    @property
    def cache_slots(self) -> List[CacheSlot]:
        return self._cache_slots if self._cache_slots is not None else float_slots(self.cache_shapes)

    @cache_slots.setter
    def cache_slots(self, slots: List[CacheSlot]) -> None:
        self._cache_slots = list(slots)

    def _run(self, arrays: List[np.ndarray]) -> List[np.ndarray]:
        raise NotImplementedError

    def empty_cache(self, batch: int, capacity: int = 0):
        slots = self.cache_slots
        empty = [s.empty(batch, capacity) for s in slots]
        return CacheBuffers(empty, 0, slots) if self.cache_io == "buffer" else empty

    def run(self, ids, cache, attention_mask=None) -> Tuple[np.ndarray, list]:
        """logits (B, S, V) and the new cache: a list of (B, H_kv, past + S, d) arrays (a sliding-window layer's
        holding the last W - 1 positions), or for the buffer flavour a CacheBuffers whose buffers now hold the new
        positions too. With sliding-window layers the cache may not tell how many tokens came before: attention_mask
        (B, past + S) does, and is needed when every layer has a window."""
        ids = np.asarray(ids)
        if self.cache_io == "buffer":
            return self._run_buffers(ids, cache, attention_mask)
        if attention_mask is not None:
            past_len = np.asarray(attention_mask).shape[1] - ids.shape[1]
        else:
            windows = self.cache_windows or [None] * len(cache)
            full = [s.length(c) for c, s, w in zip(cache, self.cache_slots, windows) if w is None]
            if not full:
                raise ServeError("every layer has a sliding window, so the cache does not say how many tokens came "
                                 "before: pass attention_mask (batch, past + new)")
            past_len = full[0]
        feeds = decoder_feeds(ids, past_len, attention_mask)
        out = self._run(list(feeds) + [np.ascontiguousarray(c) for c in cache])
        windows = self.cache_windows or [None] * len(out[1:])
        full = [(c, s) for c, s, w in zip(out[1:], self.cache_slots, windows) if w is None]
        _check_cache_outputs([c for c, _ in full], [s for _, s in full], past_len + ids.shape[1], "concat")
        return out[0], out[1:]

    def _run_buffers(self, ids, cache: "CacheBuffers", attention_mask=None):
        """One call of a buffer-flavour graph: the buffers go in as they are (no copy), the mask marks their filled
        slots, and the new positions the graph returns are written into the buffers."""
        batch, seq = ids.shape
        cache = cache.with_room(seq)
        past = cache.length
        graph_mask = np.zeros((batch, cache.capacity + seq), np.int64)  # empty slots stay 0
        if attention_mask is None:  # every position real: positions continue from the cache
            ids = np.asarray(ids, np.int64)
            graph_mask[:, :past] = 1
            graph_mask[:, cache.capacity:] = 1
            positions = np.tile(np.arange(past, past + seq, dtype=np.int64), (batch, 1))
        else:
            ids, mask, positions = decoder_feeds(ids, past, attention_mask)
            graph_mask[:, :past] = mask[:, :past]
            graph_mask[:, cache.capacity:] = mask[:, past:]
        out = self._run([ids, graph_mask, positions] + cache.buffers)
        _check_cache_outputs(out[1:], cache.slots, seq, "buffer")
        for buf, slot, new in zip(cache.buffers, cache.slots, out[1:]):
            buf[slot.span(past, past + seq)] = new
        return out[0], CacheBuffers(cache.buffers, past + seq, cache.slots)

    def prefill(self, ids, attention_mask=None):
        return self.run(ids, self.empty_cache(np.asarray(ids).shape[0]), attention_mask)

    def step(self, ids, cache, attention_mask=None):
        return self.run(ids, cache, attention_mask)
