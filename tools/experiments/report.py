"""What the study tools (tools/study.py, tools/uptrain_study.py, tools/lr_study.py) write: strict JSON and text files,
each replaced atomically."""
from __future__ import annotations

import json
import math
import os
import tempfile

__all__ = ["finite_or_null", "write_atomic", "write_json"]


def finite_or_null(x):
    """x with NaN / Inf floats as None (null): strict JSON, where a diverged or missing value has no number."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: finite_or_null(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [finite_or_null(v) for v in x]
    return x


def write_atomic(path: str, text: str) -> None:
    """Write `text` to `path` through a temporary file in the same folder (readers never see half a file)."""
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path) or ".", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(tmp, 0o644)  # mkstemp makes 0600
    os.replace(tmp, path)


def write_json(path: str, payload) -> None:
    write_atomic(path, json.dumps(finite_or_null(payload), indent=1))
