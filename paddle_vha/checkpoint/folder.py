"""A checkpoint folder, opened once: config.json read, every safetensors header read on first use, no tensor data.

    ck = CheckpointFolder.open("runs/quickstart/vha")
    ck.config                 # config.json as a dict
    ck.tensors                # name -> TensorRef (file, dtype, shape, byte range), from the headers only
    ck.shapes                 # name -> shape
    ck.read("model.norm.weight")

fold, compress, export and the tensor-parallel loader take a CheckpointFolder (or a path, opened here) and pass it
along, so a folder's config and headers are read once per process. `write_checkpoint_folder` writes the same layout.
Every problem is a one-line CheckpointError; a folder is never modified by reading it.
"""
from __future__ import annotations

import json
import os
import shutil
import stat
from typing import Dict, Iterable, List, Optional, Tuple, Union

import numpy as np

from . import safetensors_io as st
from .contract import (INDEX_FILE, SINGLE_FILE, WEIGHT_FILES, CheckpointError, Shapes, few, file_problem,
                       read_json_object)
from .fsutil import MARKER, atomic_dir

__all__ = ["CheckpointFolder", "tensor_refs", "write_checkpoint_folder", "save_pretrained_atomic", "remove_save_marker"]


def _read_config(path: str) -> dict:
    if not os.path.isdir(path):
        raise CheckpointError(f"{path}: not a directory")
    cfg_path = os.path.join(path, "config.json")
    if not os.path.lexists(cfg_path):
        raise CheckpointError(f"{cfg_path}: missing (a checkpoint folder needs config.json)")
    cfg = read_json_object(cfg_path)
    kind = cfg.get("model_type")
    if kind is not None and not isinstance(kind, str):  # every tool looks it up in the registry by it
        raise CheckpointError(f"{cfg_path}: model_type must be a string, got {kind!r:.60}")
    return cfg


def tensor_refs(path: str) -> Dict[str, st.TensorRef]:
    """Every tensor of one safetensors file, from its checked header (CheckpointError, one line, if it is broken)."""
    problem = file_problem(path)  # before opening: a FIFO would block, a device would stream forever
    if problem:
        raise CheckpointError(f"{path}: unreadable safetensors file (it is {problem})")
    try:
        return st.read_header(path)[1]
    except st.SafetensorsFormatError as e:
        raise CheckpointError(f"unreadable safetensors file: {e}") from None
    except OSError as e:
        raise CheckpointError(f"{path}: unreadable safetensors file ({e.strerror or e})") from None


def _no_duplicates(pairs):
    keys = [k for k, _ in pairs]
    dup = sorted({k for k in keys if keys.count(k) > 1})
    if dup:
        raise ValueError(f"names a tensor twice: {few(dup)}")
    return dict(pairs)


def _read_index(index: str) -> Dict[str, str]:
    """The index's weight_map, checked: an object of tensor name -> shard file name, no name twice, every shard a plain
    file name inside the folder."""
    problem = file_problem(index)
    if problem:
        raise CheckpointError(f"{index}: {problem}")
    try:
        with open(index, encoding="utf-8") as f:
            data = json.load(f, object_pairs_hook=_no_duplicates)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{index}: malformed index ({type(e).__name__}: {e})") from None
    except RecursionError:
        raise CheckpointError(f"{index}: malformed index (nested too deeply)") from None
    except ValueError as e:
        raise CheckpointError(f"{index}: {e}") from None
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict):
        raise CheckpointError(f"{index}: malformed index (no \"weight_map\" object)")
    for name, fname in weight_map.items():
        if not isinstance(fname, str):
            raise CheckpointError(f"{index}: shard of {name} is {fname!r}, not a file name")
        if fname in ("", ".", "..") or "/" in fname or os.sep in fname:
            raise CheckpointError(f"{index}: shard {fname!r} of {name} is not a file name inside the folder")
    return weight_map


class CheckpointFolder:
    """config.json and the safetensors headers of one checkpoint folder (see the module docstring)."""

    def __init__(self, path: str):
        self.path = str(path)
        self.config: dict = _read_config(self.path)
        self._tensors: Optional[Dict[str, st.TensorRef]] = None

    @classmethod
    def open(cls, folder: Union[str, os.PathLike, "CheckpointFolder"]) -> "CheckpointFolder":
        """`folder` itself if it is already open, else the folder at that path."""
        return folder if isinstance(folder, CheckpointFolder) else cls(os.fspath(folder))

    def __repr__(self) -> str:
        return f"CheckpointFolder({self.path!r})"

    @property
    def model_type(self):
        return self.config.get("model_type")

    @property
    def weight_map(self) -> Dict[str, str]:
        """Tensor name -> safetensors file name, from the index json or the single model.safetensors."""
        return {name: os.path.basename(ref.path) for name, ref in self.tensors.items()}

    @property
    def tensors(self) -> Dict[str, st.TensorRef]:
        """Every tensor's TensorRef, read from the headers of the files the index names (once)."""
        if self._tensors is None:
            self._tensors = self._read_tensors()
        return self._tensors

    @property
    def shapes(self) -> Shapes:
        return {name: ref.shape for name, ref in self.tensors.items()}

    def _read_tensors(self) -> Dict[str, st.TensorRef]:
        index = os.path.join(self.path, INDEX_FILE)
        if os.path.lexists(index):
            weight_map = _read_index(index)
            files = sorted(set(weight_map.values()))
            for fname in files:
                problem = file_problem(os.path.join(self.path, fname))
                if problem:
                    raise CheckpointError(f"{index}: lists shard {fname!r}, which is {problem}")
            refs: Dict[str, st.TensorRef] = {}
            for fname in files:
                for name, ref in tensor_refs(os.path.join(self.path, fname)).items():
                    if weight_map.get(name) == fname:
                        refs[name] = ref
            missing = sorted(set(weight_map) - set(refs))
            if missing:
                raise CheckpointError(f"{self.path}: index lists tensors its shard does not hold: {few(missing)}")
            return refs
        single = os.path.join(self.path, SINGLE_FILE)
        if os.path.lexists(single):
            return tensor_refs(single)
        raise CheckpointError(f"{self.path}: no {INDEX_FILE} or {SINGLE_FILE}")

    def require_float(self) -> None:
        """CheckpointError if a tensor is not floating point (the converters do float math on every tensor)."""
        bad = sorted(n for n, r in self.tensors.items() if r.dtype not in st.FLOAT_CODES)
        if bad:
            raise CheckpointError(f"{self.path}: non-floating tensors: {bad[0]} ({self.tensors[bad[0]].dtype})")

    def read(self, name: str) -> np.ndarray:
        """One tensor in its stored dtype (bfloat16 as ml_dtypes.bfloat16)."""
        return st.read_tensor(self.tensors[name])

    def read_all(self, float32: bool = True) -> Dict[str, np.ndarray]:
        """Every tensor: 16-bit floats widened to float32 (exactly); float64 narrowed to float32 unless float32=False."""
        out = {}
        for name, ref in self.tensors.items():
            a = st.read_tensor(ref)
            if ref.dtype in ("BF16", "F16") or (float32 and ref.dtype == "F64"):
                a = st.to_float32(a)
            out[name] = a
        return out

    def side_files(self) -> Tuple[List[str], List[str]]:
        """(files, folders) beside the weights and config.json: tokenizer, generation config, ... (what a converter
        copies, and what it cannot). CheckpointError for anything else (a FIFO, a socket, a device: copying one could
        block or read forever)."""
        files, folders = [], []
        for f in sorted(os.listdir(self.path)):
            if f in ("config.json", INDEX_FILE, MARKER) or WEIGHT_FILES.search(f):
                continue
            mode = side_file_mode(os.path.join(self.path, f))
            if stat.S_ISREG(mode):
                files.append(f)
            elif stat.S_ISDIR(mode):
                folders.append(f)
            else:
                path = os.path.join(self.path, f)
                raise CheckpointError(f"{path}: {file_problem(path)}, not a regular file or folder; refusing to copy it")
        return files, folders


def side_file_mode(path: str) -> int:
    """os.stat(path).st_mode, or CheckpointError (one line, file_problem's words) for a link that cannot be followed
    (a loop, a dangling link) or a file that cannot be looked at."""
    try:
        return os.stat(path).st_mode
    except OSError:
        raise CheckpointError(f"{path}: {file_problem(path)}; refusing to copy it") from None


def write_checkpoint_folder(folder: str, shards: List[list], chunks, config: dict, total_size: int,
                            copy_from: Optional[str] = None, copy_files: Iterable[str] = (),
                            on_written=None) -> Dict[str, str]:
    """Write a whole checkpoint folder: shards, index json, config.json, and side files copied from `copy_from`.

    shards: st.plan_shards' output, lists of (name, dtype code, shape). chunks(name, code, shape) yields the tensor's
    rows in order, already in `code` (one array, or row blocks for streaming). on_written(name, nbytes) is called
    per chunk (progress bars). Returns the weight map. Callers wrap this in fsutil.atomic_dir.
    """
    weight_map: Dict[str, str] = {}
    for k, shard in enumerate(shards, 1):
        fname = st.shard_name(k, len(shards))
        writer = st.ShardWriter(os.path.join(folder, fname), shard)
        try:
            for name, code, shape in shard:
                for rows in chunks(name, code, shape):
                    writer.write(name, rows)
                    if on_written is not None:
                        on_written(name, rows.nbytes)
                weight_map[name] = fname
            writer.close()
        except BaseException:
            writer.abort()
            raise
    st.write_index(os.path.join(folder, INDEX_FILE), weight_map, total_size)
    with open(os.path.join(folder, "config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2, sort_keys=True)
        f.write("\n")
    for name in copy_files:
        shutil.copy2(os.path.join(copy_from, name), os.path.join(folder, name))
    return weight_map


def remove_save_marker(folder: str) -> None:
    """PaddleFormers' save_pretrained leaves a `saved_signal_<rank>` file; it is not part of the checkpoint contract."""
    for name in os.listdir(folder):
        if name.startswith("saved_signal_"):
            try:
                os.remove(os.path.join(folder, name))
            except FileNotFoundError:  # another rank of a collective save removed it first
                pass


def save_pretrained_atomic(model, dest: str) -> None:
    """model.save_pretrained(dest) through a temporary sibling folder: `dest` appears complete or not at all (an
    existing one is replaced only then), without PaddleFormers' save marker."""
    with atomic_dir(dest) as tmp:
        model.save_pretrained(tmp)
        remove_save_marker(tmp)
