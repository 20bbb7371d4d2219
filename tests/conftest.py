import os
import subprocess
import sys

import numpy as np
import paddle
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.append(os.path.join(ROOT, "tools"))  # tools/prologue_check: the float64 oracle, shared with tools/gpu_check.py


@pytest.fixture(autouse=True)
def _fp32_and_seeded():
    paddle.set_default_dtype("float32")
    paddle.seed(1234)
    np.random.seed(1234)
    yield
    paddle.set_default_dtype("float32")


@pytest.fixture(scope="session")
def hf_python():
    """The side environment's python (tools/hf_env.sh: transformers + PyTorch, Optimum, onnxruntime-genai), created
    once (~1 min the first time); the test is skipped with the reason if it cannot be created."""
    res = subprocess.run(["bash", os.path.join(ROOT, "tools", "hf_env.sh")], capture_output=True, text=True, timeout=900)
    if res.returncode != 0:
        tail = (res.stderr.strip().splitlines() or ["(no output)"])[-1]
        pytest.skip(f"cannot create .venv-hf (tools/hf_env.sh exit {res.returncode}: {tail})")
    return res.stdout.strip().splitlines()[-1]


def pytest_collection_modifyitems(session, config, items):
    """Files holding slow or multi-rank tests first (each file's own order kept): the suite runs one file per
    worker (`--dist loadfile`), and a long file handed out last leaves the other worker idle at the end."""
    heavy = {item.path for item in items if item.get_closest_marker("slow") or item.get_closest_marker("multirank")}
    items.sort(key=lambda item: item.path not in heavy)
