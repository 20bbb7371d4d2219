"""The float32 ONNX export a data tool runs the original model through (make_heal_data samples with it,
store_teacher runs the teacher with it): exported once by export_onnx in its own process, reused when the folder is
complete (it has export_info.json, which export_onnx writes last); a failed export raises ExportError (one line: the
export's last line of error), which the tools print and exit 2 with."""
from __future__ import annotations

import os
import subprocess
import sys

from .errors import ExportError

__all__ = ["is_export", "float32_export"]


def is_export(folder: str) -> bool:
    return os.path.isfile(os.path.join(folder, "export_info.json"))


def float32_export(model_dir: str, dest: str, why: str) -> str:
    """dest, holding model_dir's float32 export (made now unless it is there); `why` ends the progress line."""
    if is_export(dest):
        print(f"{why} with {dest} (made earlier)", file=sys.stderr)
        return dest
    print(f"exporting {model_dir} to {dest} (float32, with its KV cache) {why}", file=sys.stderr)
    r = subprocess.run([sys.executable, "-m", "paddle_vha.cli.export_onnx", model_dir, dest],
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        raise ExportError(f"exporting {model_dir} failed: {(r.stderr.strip().splitlines() or ['(no message)'])[-1]}")
    return dest
