"""The plan every checkpoint transform makes before it writes anything: TransformPlan and the output tensors (Entry).

A planner (plan_fold, plan_convert, plan_compress, plan_import) validates its input from config.json and the
safetensors headers alone, then fills a TransformPlan subclass through `TransformPlan.build`: one Entry per output
tensor (its name, shape, dtype and how it is made from which input tensors), laid out in shards, plus the side
files to copy and the config.json to write. Reading, writing and describing go through the shared code.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar, Iterable, List, Optional, Tuple, Type

import numpy as np

from ..checkpoint import safetensors_io as st
from ..checkpoint.contract import CheckpointError
from ..checkpoint.folder import CheckpointFolder
from ..checkpoint.fsutil import check_output_dir

__all__ = ["Entry", "TransformPlan", "open_output", "layout_shards"]


@dataclass
class Entry:
    """One output tensor: made by `how` from the input tensors `sources`.

    how "copy" streams sources[0] as it is (row ranges, cast to `code`); any other value is the transform's own
    (its `make(entry)` computes the tensor). take: (axis, indices) of a fused source this tensor is a part of."""

    name: str
    shape: Tuple[int, ...]
    code: str  # safetensors dtype code of the output
    how: str = "copy"
    sources: Tuple[str, ...] = ()
    take: Optional[Tuple[int, np.ndarray]] = None

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * st.DTYPES[self.code].itemsize

    @property
    def spec(self) -> Tuple[str, str, Tuple[int, ...]]:
        """(name, dtype code, shape): what a shard header holds."""
        return self.name, self.code, tuple(self.shape)


def open_output(source: CheckpointFolder, out_dir: str, force: bool, error) -> None:
    """The checks every transform runs on OUT_DIR and its input: fsutil's output rule, and floating-point tensors only
    (the transforms do float math on every tensor). One line (`error`, or CheckpointError) when refused."""
    check_output_dir(out_dir, [source.path], force, error)
    source.require_float()


def layout_shards(entries: Iterable[Entry], max_shard_size, error) -> List[list]:
    """The entries, in order, in shards of at most --max-shard-size bytes (lists of (name, code, shape))."""
    try:
        max_bytes = st.parse_size(max_shard_size)
    except ValueError as e:
        raise error(f"--max-shard-size: {e}") from None
    return st.plan_shards([e.spec for e in entries], max_bytes)


@dataclass(kw_only=True)
class TransformPlan:
    """What a transform writes: every output tensor (`entries`, in file order, laid out in `shards`), the config.json
    (`out_config`), the side files copied from the source, and whether an existing OUT_DIR may be replaced.

    Subclasses set `tool` (the name in OUT_DIR's marker), `verb` ("refusing to <verb>"), `error` (their one-line
    exception) and `describe()` (what the plan printer shows), and add the fields of their own planning."""

    tool: ClassVar[str] = "paddle-vha"
    verb: ClassVar[str] = "transform"
    error: ClassVar[Type[CheckpointError]] = CheckpointError

    source: CheckpointFolder
    out_dir: str
    cfg: Any  # the model config the transform is about (Qwen3VHAConfig, Qwen3MEAConfig)
    out_config: dict
    entries: List[Entry]
    shards: List[list]
    out_code: Optional[str] = None  # the dtype of every output tensor; None: each keeps its input's
    copy_files: List[str] = field(default_factory=list)  # tokenizer, generation config, ...
    skipped: List[str] = field(default_factory=list)  # folders beside the weights, not copied
    notes: List[str] = field(default_factory=list)
    force: bool = False  # replace an existing OUT_DIR (one this project wrote)
    source_family: Any = None  # paddle_vha.families.Family of the checkpoint read (the converters: a stock base's)
    target: Any = None  # ... of the checkpoint written (the variant over that base)

    @classmethod
    def build(cls, source: CheckpointFolder, out_dir: str, entries: Iterable[Entry], max_shard_size="5GB", **fields):
        """The plan with `entries` in natural name order (layers.2 before layers.10), laid out in shards, and the
        source's side files; `fields` are the rest of the dataclass's fields."""
        entries = sorted(entries, key=lambda e: st.natural_key(e.name))
        shards = layout_shards(entries, max_shard_size, cls.error)
        copy_files, skipped = source.side_files()
        return cls(source=source, out_dir=out_dir, entries=entries, shards=shards, copy_files=copy_files,
                   skipped=skipped, **fields)

    @property
    def in_dir(self) -> str:
        return self.source.path

    @property
    def inputs(self):
        """Input tensor name -> TensorRef (from the headers, read once)."""
        return self.source.tensors

    @property
    def in_config(self) -> dict:
        return self.source.config

    @property
    def bytes_in(self) -> int:
        return sum(r.nbytes for r in self.inputs.values())

    @property
    def bytes_out(self) -> int:
        return sum(e.nbytes for e in self.entries)

    def describe(self):
        """The plan as a describe.Description (title, header lines, table, footer, notes)."""
        raise NotImplementedError

    def refused(self, err: Exception) -> CheckpointError:
        """The one-line error for a tensor this transform will not write (a NaN / Inf, an overflowing cast)."""
        return self.error(f"{err}; refusing to {self.verb}")

    def read_float64(self, name: str) -> np.ndarray:
        """Input tensor `name` as float64 numpy for the transform's math; refused if it holds a NaN or Inf."""
        ref = self.inputs[name]
        try:
            return st.to_float64(st.cast_finite(st.read_tensor(ref), ref.dtype, name))
        except ValueError as e:
            raise self.refused(e) from None
