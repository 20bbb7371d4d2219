"""The one write step of the checkpoint transforms: a plan's entries into OUT_DIR, atomically, tensor by tensor.

Copies stream in row ranges of `chunk_bytes` (pread, never a whole shard); a computed tensor is held once, as its
transform returns it. Every block is checked finite and cast to its output dtype on the way (one rounding). The
folder is written inside fsutil.atomic_dir, so OUT_DIR appears complete, after `check(folder)`, or not at all.
"""
from __future__ import annotations

import os
from typing import Callable, Iterator, Optional

import numpy as np

from ..checkpoint import safetensors_io as st
from ..checkpoint.contract import CheckpointError
from ..checkpoint.folder import write_checkpoint_folder
from ..checkpoint.fsutil import atomic_dir
from .plan import Entry, TransformPlan

__all__ = ["write_plan"]


def _blocks(plan: TransformPlan, entry: Entry, make, chunk_bytes: int) -> Iterator[np.ndarray]:
    """Consecutive row blocks of one output tensor in its output dtype; plan.refused(...) for a NaN / Inf or a value the
    dtype cannot hold."""
    try:
        if entry.how == "copy":
            ref = plan.inputs[entry.sources[0]]
            if tuple(ref.shape) != tuple(entry.shape):  # planners check shapes first: a cheap invariant
                raise plan.error(f"{entry.name}: input shape {list(ref.shape)}, planned {list(entry.shape)} (a bug)")
            for a, b in st.row_chunks(ref, chunk_bytes):
                yield st.cast_finite(st.read_rows(ref, a, b), entry.code, entry.name)
            return
        arr = make(entry)
        if tuple(arr.shape) != tuple(entry.shape):
            raise plan.error(f"{entry.name}: produced shape {list(arr.shape)}, planned {list(entry.shape)} (a bug)")
        yield st.cast_finite(np.ascontiguousarray(arr), entry.code, entry.name)
    except CheckpointError:
        raise
    except ValueError as e:  # refused: the output folder is removed (the caller writes inside atomic_dir)
        raise plan.refused(e) from None


def write_plan(plan: TransformPlan, make: Optional[Callable[[Entry], np.ndarray]] = None, progress: bool = True,
               chunk_bytes: int = 8 << 20, on_tensor: Optional[Callable[[Entry], None]] = None,
               check: Optional[Callable[[str], None]] = None,
               side_files: Optional[Callable[[str], None]] = None) -> str:
    """Write the checkpoint `plan` describes to a temporary folder beside OUT_DIR, then rename it to OUT_DIR.

    make(entry): the tensor of every entry that is not a copy (numpy, any float dtype). on_tensor(entry) runs once an
    entry's last rows are written; side_files(folder) writes the files the transform makes itself (import_gguf: the
    tokenizer) beside the weights; check(folder) on the complete folder before it becomes OUT_DIR (if it raises,
    nothing is written). The source is only read. An existing OUT_DIR (allowed by plan.force) is replaced only by a
    complete new folder; without force a concurrent run that finished first wins. Returns OUT_DIR (absolute).
    """
    from tqdm import tqdm

    out_dir = os.path.abspath(plan.out_dir)
    by_name = {e.name: e for e in plan.entries}

    def chunks(name, code, shape):
        yield from _blocks(plan, by_name[name], make, chunk_bytes)
        if on_tensor is not None:
            on_tensor(by_name[name])

    with atomic_dir(out_dir, tool=plan.tool, replace=plan.force, error=plan.error) as tmp:
        bar = tqdm(total=plan.bytes_out, unit="B", unit_scale=True, desc=plan.verb, disable=not progress, leave=False)
        try:
            write_checkpoint_folder(tmp, plan.shards, chunks, plan.out_config, plan.bytes_out, plan.in_dir,
                                    plan.copy_files, on_written=lambda name, nbytes: bar.update(nbytes))
        finally:
            bar.close()
        if side_files is not None:
            side_files(tmp)
        if check is not None:
            check(tmp)
    return out_dir
