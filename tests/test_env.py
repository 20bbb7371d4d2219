"""The pinned environment is consistent."""
import subprocess
import sys


def test_pip_check_is_clean():
    res = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True)
    print(res.stdout, res.stderr)
    assert res.returncode == 0 and "No broken requirements found" in res.stdout


def test_every_pinned_dependency_imports():
    """pip check reads metadata only; some wheels (pyarrow 26 vs NumPy 1.x) fail at import time instead."""
    mods = ["paddle", "paddleformers", "paddleformers.trainer", "datasets", "pyarrow", "safetensors", "onnx",
            "onnxruntime", "paddle2onnx", "tqdm", "transformers", "matplotlib", "numpy"]
    code = "import importlib\nfor m in %r: importlib.import_module(m)\nprint('ok')" % mods
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0 and res.stdout.strip().endswith("ok"), res.stderr[-2000:]
