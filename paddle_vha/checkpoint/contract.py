"""What every checkpoint folder of this project shares, whatever its model family (docs/checkpoint.md).

Layout (Hugging Face style, what PaddleFormers writes for Qwen3): safetensors files, optionally sharded with
`model.safetensors.index.json`; Linear weights stored [out, in]; config.json beside them. Each family names its
tensors and their shapes (`tensor_shapes(config)` in paddle_vha/{qwen3,vha,mea}/contract.py); `compare_shapes`
checks a folder against them with one-line errors.
"""
from __future__ import annotations

import json
import re
from typing import Dict, Tuple

__all__ = ["CheckpointError", "Shapes", "INDEX_FILE", "SINGLE_FILE", "WEIGHT_FILES", "is_linear_weight",
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


def read_json_object(path: str, error=CheckpointError) -> dict:
    """A JSON file holding an object (config.json, export_info.json, tp_plan.json, a trainer config), or `error` with
    one line: not valid JSON (or not UTF-8), or not an object."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise error(f"{path}: not valid JSON ({e})") from None
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
