"""tools/profile_decode.py on a small export: the per-node-type table adds up to the kernels' time, every step runs
the same nodes, the steps' run time holds the kernels, and a folder that is not an export is one line."""
import json
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools"))
import profile_decode  # noqa: E402
from test_export_quant import make_checkpoint  # noqa: E402


def test_the_profile_adds_up(tmp_path, capsys):
    from paddle_vha.export.onnx_export import export_onnx

    make_checkpoint(tmp_path / "ckpt")
    export_onnx(str(tmp_path / "ckpt"), str(tmp_path / "out"), decode_steps=2, log=lambda m: None)
    capsys.readouterr()
    assert profile_decode.main([str(tmp_path / "out"), "--prompt", "17", "--batch", "2", "--steps", "3", "--threads",
                                "1", "--json", str(tmp_path / "p.json")]) == 0
    out = capsys.readouterr().out
    print(out)
    p = json.loads((tmp_path / "p.json").read_text())
    total = sum(r["ms"] for r in p["ops"])
    assert abs(total - p["kernel_ms"]) <= 1e-6 * max(1.0, total) and 0 < p["kernel_ms"] <= p["run_ms"] <= p["wall_ms"]
    nodes = {r["op"]: r["nodes"] for r in p["ops"]}
    assert all(float(n).is_integer() for n in nodes.values()), nodes  # each step ran the same nodes
    assert nodes.get("MatMul", 0) >= 2 and "node type" in out and "between kernels" in out


def test_a_folder_that_is_not_an_export_is_one_line(tmp_path, capsys):
    os.makedirs(tmp_path / "empty")
    assert profile_decode.main([str(tmp_path / "empty")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: "), err


def test_ranges(capsys):
    with pytest.raises(SystemExit):
        profile_decode.parse_args(["x", "--steps", "0"])
