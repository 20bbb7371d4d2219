"""The README's main job (tools/quickstart.py, the experiment in tools/experiments/quickstart.py), run small: it trains,
prints the comparison table and writes a valid checkpoint."""
import json
import os
import re
import subprocess
import sys

from _utils import validate_vha_checkpoint
from paddle_vha.checkpoint.fsutil import MARKER

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOL = os.path.join(ROOT, "tools", "quickstart.py")


def run(*args):
    return subprocess.run([sys.executable, TOOL, *args], capture_output=True, text=True, timeout=600, cwd=ROOT)


def test_quickstart_small(tmp_path):
    layers, head_dim = 2, 16
    res = run("--steps", "12", "--hidden-size", "64", "--layers", str(layers), "--head-dim", str(head_dim),
              "--seq-len", "32", "--batch-size", "4", "--val-batches", "2", "--corpus-mb", "1",
              "--no-progress", "--out", str(tmp_path))
    print(res.stdout)
    assert res.returncode == 0, res.stderr[-3000:]
    rows = {m.group(1): m.groups() for m in re.finditer(
        r"^(GQA-8|VHA \(GQA-2\))\s+(\d+)\s+([\d,]+)\s+([\d,]+)\s+([\d,]+)\s+([\d,]+)\s+([\d.]+) -> ([\d.]+)\s+([\d.]+)",
        res.stdout, re.M)}
    assert set(rows) == {"GQA-8", "VHA (GQA-2)"}, res.stdout
    num = lambda s: int(s.replace(",", ""))  # noqa: E731
    for label, h_kv in (("GQA-8", 8), ("VHA (GQA-2)", 2)):
        row = rows[label]
        assert num(row[1]) == h_kv
        assert num(row[4]) == 2 * h_kv * head_dim * 2  # K and V, bf16, one layer
        assert num(row[5]) == 2 * h_kv * head_dim * 2 * layers
        first, last = float(row[6]), float(row[7])
        assert last < first - 0.5, f"{label}: loss did not drop ({first} -> {last})"
    assert num(rows["VHA (GQA-2)"][2]) < num(rows["GQA-8"][2])
    assert "4.0x smaller" in res.stdout
    cfg = validate_vha_checkpoint(str(tmp_path / "vha"))
    assert cfg.num_key_value_heads == 2 and cfg.num_hidden_layers == layers

    # fold -> export -> generate ran on the trained model, with its parity numbers
    fold = re.search(r"fold parity .* max abs diff (\S+), max rel (\S+), mean KL (\S+)", res.stdout)
    assert fold and float(fold.group(2)) <= 1e-5 and float(fold.group(3)) <= 1e-8, res.stdout
    export = re.search(r"validation: .* max abs diff (\S+); (\d+) greedy decode steps: max abs diff (\S+); greedy tokens match",
                       res.stdout)
    assert export and float(export.group(1)) <= 1e-4 and float(export.group(3)) <= 1e-4 and int(export.group(2)) >= 16
    lines = re.findall(r"^  '(def |import |class Test|    return )", res.stdout, re.M)
    assert len(lines) == 4, res.stdout
    assert re.search(r"onnxruntime: prefill [\d.]+ ms, decode \d+ tokens/s", res.stdout)
    folded = json.load(open(tmp_path / "folded" / "config.json"))
    assert folded["model_type"] == "qwen3" and folded["num_key_value_heads"] == 2 and folded["num_attention_heads"] == 16
    assert sorted(os.listdir(tmp_path / "onnx")) == [MARKER, "config.json", "export_info.json", "genai_config.json", "model.onnx",
                                                  "paddle", "tokenizer.json", "tokenizer_config.json"]


def test_quickstart_help_and_bad_args():
    res = run("--help")
    assert res.returncode == 0 and "--steps" in res.stdout
    res = run("--steps", "0")
    assert res.returncode != 0 and "--steps must be >= 1" in res.stderr


PYTHON_WORDS = {"def", "return", "self", "if", "else", "for", "in", "import", "class", "not", "None", "raise", "try",
                "except", "is", "assert", "while", "with", "and", "or", "True", "False", "pass", "elif", "lambda"}


def test_demo_checkpoint_generates_python(tmp_path):
    """The quick-start's last stage on the demo checkpoint kept in the repository (assets/demo-vha): fold, export
    (self-validated) and sampled generation give text a person reads as Python, not whitespace."""
    import argparse
    import contextlib
    import io

    from tools.experiments.quickstart import DEMO_DIR, DEMO_PROMPTS, demo

    info = json.load(open(os.path.join(DEMO_DIR, "demo_info.json")))
    assert info["command"] == "python tools/train.py configs/demo-vha.json" and info["val_loss"] < 1.6
    cfg = validate_vha_checkpoint(DEMO_DIR)
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_key_value_heads) == (256, 4, 2)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        demo(argparse.Namespace(out=str(tmp_path), seed=0, demo_tokens=120))
    text = out.getvalue()
    print(text)
    samples = re.split(r"^  ----- prompt .*$", text, flags=re.M)[1:]
    assert len(samples) == len(DEMO_PROMPTS)
    body = "".join(line[4:] + "\n" for line in text.splitlines() if line.startswith("  | "))
    words = set(re.findall(r"[A-Za-z_]+", body))
    print("Python words seen:", sorted(words & PYTHON_WORDS))
    assert len(words & PYTHON_WORDS) >= 6, "keywords and self"
    assert sum(c.isspace() for c in body) / len(body) < 0.6, "mostly text, not whitespace"
    assert re.search(r"^ {4,}\S", body, re.M), "indented lines"
