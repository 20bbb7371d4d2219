"""What every checkpoint folder of this project shares, whatever its model family (docs/checkpoint.md).

Layout (Hugging Face style, what PaddleFormers writes for Qwen3): safetensors files, optionally sharded with
`model.safetensors.index.json`; Linear weights stored [out, in]; config.json beside them. Each family names its
tensors and their shapes (`tensor_shapes(config)` in paddle_vha/{qwen3,vha,mea}/contract.py); `compare_shapes`
checks a folder against them with one-line errors.
"""
from __future__ import annotations

import errno
import json
import os
import re
import stat
from typing import Dict, Tuple

__all__ = ["file_problem", "CheckpointError", "Shapes", "INDEX_FILE", "SINGLE_FILE", "WEIGHT_FILES", "is_linear_weight",
           "compare_shapes", "few", "read_json_object"]

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
# Files of a checkpoint folder that describe its weights: a converter rewrites or drops them, never copies them.
WEIGHT_FILES = re.compile(r"(\.safetensors|\.safetensors\.index\.json|\.pdparams|\.bin|\.pt|\.pth|\.metadata)$|^saved_signal_")

Shapes = Dict[str, Tuple[int, ...]]


class CheckpointError(ValueError):
    """A checkpoint folder that does not match the contract; the message is one line naming the problem."""


def is_linear_weight(name: str, ndim: int) -> bool:
    """A Linear weight: [out, in] on disk, [in, out] in Paddle's memory (transposed on every load and save)."""
    return ndim == 2 and name.endswith("_proj.weight")


MAX_JSON_BYTES = 64 << 20  # config.json, an index, export_info.json: far below this; a bigger file is not one of them


def file_problem(path: str):
    """None if `path` is a regular file (through links), else what it is, in words: "missing", "a directory",
    "a FIFO", "a device", "a socket", "a symlink loop", "a dangling symlink", "unreadable (...)"."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return "a dangling symlink" if os.path.islink(path) else "missing"
    except OSError as e:
        return "a symlink loop" if e.errno == errno.ELOOP else f"unreadable ({e.strerror})"
    if stat.S_ISREG(mode):
        return None
    return ("a directory" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode)
            else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "a socket" if stat.S_ISSOCK(mode)
            else "not a regular file")


def read_json_object(path: str, error=CheckpointError) -> dict:
    """A JSON file holding an object (config.json, export_info.json, tp_plan.json, a trainer config), or `error` with
    one line: not a regular file (missing, a folder, a FIFO, a device, a link loop), too big, not valid JSON (or not
    UTF-8, nested too deeply, a number too long to convert), or not an object."""
    problem = file_problem(path)
    if problem:
        raise error(f"{path}: {problem}")
    if os.path.getsize(path) > MAX_JSON_BYTES:
        raise error(f"{path}: {os.path.getsize(path)} bytes, too big for a JSON configuration file "
                    f"(limit {MAX_JSON_BYTES >> 20} MB)")
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise error(f"{path}: not valid JSON ({e})") from None
    except RecursionError:
        raise error(f"{path}: not a usable JSON object (nested too deeply)") from None
    except ValueError as e:  # e.g. an integer of more than 4300 digits
        raise error(f"{path}: not usable JSON ({str(e).splitlines()[0][:120]})") from None
    except OSError as e:
        raise error(f"{path}: unreadable ({e.strerror or e})") from None
    if not isinstance(data, dict):
        raise error(f"{path}: expected a JSON object")
    return data


def few(names, n: int = 3) -> str:
    """The first n names, and how many more."""
    names = list(names)
    more = f" (+{len(names) - n} more)" if len(names) > n else ""
    return ", ".join(names[:n]) + more


def compare_shapes(where: str, found: Shapes, expected: Shapes) -> None:
    """CheckpointError naming missing, unexpected or mis-shaped tensors."""
    missing = sorted(set(expected) - set(found))
    if missing:
        raise CheckpointError(f"{where}: missing tensors: {few(missing)}")
    extra = sorted(set(found) - set(expected))
    if extra:
        raise CheckpointError(f"{where}: unexpected tensors: {few(extra)}")
    bad = [f"{n} {list(found[n])} (expected {list(expected[n])})" for n in sorted(expected) if found[n] != expected[n]]
    if bad:
        raise CheckpointError(f"{where}: mis-shaped tensors: {few(bad)}")
