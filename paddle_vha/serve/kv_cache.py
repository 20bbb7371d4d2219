"""The cache tensors a decoder session holds, as the graph declares them: element type, shape and the axis the
positions grow along (paddle_vha/export/kv_cache.py writes the int8 cache's: keys (batch, heads, positions, head_dim)
uint8, values int8, a float32 scale (batch, heads, positions, 1) for each; the float32 cache is (batch, heads,
positions, width) float32).

A session reads the slots from the graph's own inputs (`slots_from_inputs`: the symbolic dimension besides the batch
is the positions axis), so the same runtime code serves either cache: empty caches, the buffer flavour's in-place
writes of the new positions, growth, and the concat flavour's past length all go through a slot's axis."""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import numpy as np

__all__ = ["CacheSlot", "float_slots", "slots_from_inputs", "random_cache_fill", "ORT_TYPES"]

ORT_TYPES = {"tensor(float)": np.float32, "tensor(int8)": np.int8, "tensor(uint8)": np.uint8,
             "tensor(float16)": np.float16}


@dataclass(frozen=True)
class CacheSlot:
    """One cache tensor of the graph: its dtype, its shape with the batch (axis 0) and positions (`axis`) open."""

    dtype: type
    dims: Tuple[Optional[int], ...]  # 4 entries; None at 0 and at `axis`
    axis: int  # the positions axis: 2 or 3

    def empty(self, batch: int, positions: int) -> np.ndarray:
        shape = list(self.dims)
        shape[0], shape[self.axis] = batch, positions
        return np.zeros(shape, self.dtype)

    def length(self, a: np.ndarray) -> int:
        """How many positions `a` holds."""
        return a.shape[self.axis]

    def span(self, start: int, stop: int) -> tuple:
        """The index of positions start..stop (all of the other axes)."""
        return (slice(None),) * self.axis + (slice(start, stop),)

    def positions_shape(self, a: np.ndarray, positions: int) -> tuple:
        shape = list(a.shape)
        shape[self.axis] = positions
        return tuple(shape)

    @property
    def heads(self) -> int:
        return self.dims[1]

    @property
    def bytes_per_position(self) -> int:
        """Bytes one position takes in one sequence."""
        return int(np.prod([d for k, d in enumerate(self.dims) if k not in (0, self.axis)])) * np.dtype(
            self.dtype).itemsize


def float_slots(cache_shapes: Sequence[Tuple[int, int]]) -> List[CacheSlot]:
    """The float32 cache's slots: (batch, heads, positions, width) for each (heads, width)."""
    return [CacheSlot(np.float32, (None, int(h), None, int(w)), 2) for h, w in cache_shapes]


def slots_from_inputs(args) -> List[CacheSlot]:
    """The slots of a graph's cache inputs (onnxruntime NodeArgs: type string and shape, symbolic dims as strings):
    the positions axis is the symbolic dimension besides the batch; ValueError (one line) for an input that is not a
    4-D cache tensor of a known type."""
    slots = []
    for a in args:
        open_axes = [k for k, d in enumerate(a.shape) if not isinstance(d, int)]
        if len(a.shape) != 4 or a.type not in ORT_TYPES or open_axes[:1] != [0] or len(open_axes) != 2:
            raise ValueError(f"cache input {a.name} is {a.type} {a.shape}: not a (batch, heads, .., ..) cache tensor "
                             "with one positions axis")
        axis = open_axes[1]
        slots.append(CacheSlot(ORT_TYPES[a.type], tuple(None if k in (0, axis) else int(d)
                                                         for k, d in enumerate(a.shape)), axis))
    return slots


def random_cache_fill(slot: CacheSlot, buf: np.ndarray, length: int, rng, block: int = 1 << 16) -> None:
    """Fill the first `length` positions of `buf` with values a real cache could hold (benchmarks: a step's speed
    does not depend on them): float32 N(0, 1), int8 uniform in -127..127 (uint8: 1..255), and a scale slot (one
    value per position and head) 1 / 127 times N(1, 0.1)^2. Written `block` positions of one row at a time, so the
    fill adds no cache-sized temporary to the process's peak memory (tools/bench_kv_capacity.py measures it)."""
    scale = np.dtype(slot.dtype) == np.float32 and slot.bytes_per_position == 4 * slot.heads
    for row in range(buf.shape[0]):
        for start in range(0, length, block):
            span = (row,) + slot.span(start, min(start + block, length))[1:]
            shape = buf[span].shape
            if np.dtype(slot.dtype) == np.int8:
                buf[span] = rng.integers(-127, 128, shape, dtype=np.int8)
            elif np.dtype(slot.dtype) == np.uint8:
                buf[span] = rng.integers(1, 256, shape, dtype=np.uint8)
            elif scale:  # a scale per head
                buf[span] = ((1 + 0.1 * rng.standard_normal(shape)) ** 2 / 127).astype(np.float32)
            else:
                buf[span] = rng.standard_normal(shape, np.float32)
