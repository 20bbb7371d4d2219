"""paddle-vha's build: metadata and console scripts are in pyproject.toml; this file adds what a declaration cannot.

* dependencies: requirements.txt's pins (test-only packages left out);
* the fused operators' sources (ops/build.py, ops/csrc/**; the onnxruntime library's ops/ort/**) are copied into the wheel as package data
  (paddle_vha/_ops), so an installed paddle_vha builds the op on first use or with `paddle-vha-build-ops`
  (paddle_vha/kernels/op_loader.py finds them there, or in a checkout's ops/).

Install for development with tools/env.sh (pinned venv, editable); `pip wheel .` builds the distributable wheel.
"""
import os
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
OPS_FILES = ["build.py"] + sorted(  # every file under ops/csrc and ops/ort, their subfolders (cpu/, cuda/) included
    os.path.relpath(os.path.join(folder, f), os.path.join(HERE, "ops"))
    for sub in ("csrc", "ort") for folder, _, files in os.walk(os.path.join(HERE, "ops", sub)) for f in files
    if "__pycache__" not in folder)


def requirements():
    with open(os.path.join(HERE, "requirements.txt")) as f:
        lines = [ln.split("#")[0].strip() for ln in f]
    return [ln for ln in lines if ln and not ln.startswith("pytest")]


class BuildPyWithOps(build_py):
    """build_py, plus the operator's sources under paddle_vha/_ops in the build tree."""

    def run(self):
        super().run()
        for rel in OPS_FILES:
            dest = os.path.join(self.build_lib, "paddle_vha", "_ops", rel)
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            shutil.copy2(os.path.join(HERE, "ops", rel), dest)


setup(install_requires=requirements(), cmdclass={"build_py": BuildPyWithOps})
