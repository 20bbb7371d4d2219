"""Hostile but realistic input, export_onnx on damaged checkpoints, bad options and converter failures. Each case
asserts the exit code, one line on stderr naming the problem, nothing written, and the inputs byte-identical
(helpers: tests/hostile.py). Tools run in-process through their command lines (paddle_vha/cli/*.py), which is what
tools/*.py and the installed paddle-vha-* scripts run.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import signal
import subprocess
import sys

import numpy as np
import paddle
import pytest

from _utils import TINY, tiny_config
from paddle_vha.checkpoint.fsutil import MARKER
from test_checkpoint import _rewrite_tensors
from hostile import ROOT, edit_config, edit_index, nan_at, refused, save_stock, save_vha, set_tensor, tree


EXPORT_CASES = {
    "nan-embedding-row": (lambda p: _rewrite_tensors(p, set_tensor("model.embed_tokens.weight", nan_at)), [],
                          "model.embed_tokens.weight holds 1 non-finite value(s)"),
    "opset-22": (lambda p: None, ["--opset", "22"], "converts to opsets 14..21"),
    "nan-eps": (lambda p: edit_config(p, rms_norm_eps=float("nan")), [], "rms_norm_eps"),
    "window-without-size": (lambda p: edit_config(p, sliding_window=None, use_sliding_window=False,
                                                  layer_types=["full_attention", "sliding_attention"]), [],
                            "layer_types names sliding_attention layers but sliding_window is None"),
    "vha": (lambda p: edit_config(p, model_type="qwen3_vha"), [], "fold it first"),
    # an int32 norm weight of ones exported (rc 0) and other integer values failed only by the tolerance
    "integer-tensor": (lambda p: _rewrite_tensors(p, _int_norm), [], "non-floating tensors: "),
}


def _int_norm(t):
    name = next(k for k in t if k.endswith("input_layernorm.weight"))
    t[name] = np.ones(t[name].shape, np.int32)
    return t


@pytest.mark.parametrize("case", list(EXPORT_CASES))
def test_export_refuses_hostile_input(tmp_path, capsys, case):
    from paddle_vha.cli.export_onnx import main

    src = save_stock(tmp_path / "in")
    damage, extra, needle = EXPORT_CASES[case]
    damage(src)
    before = tree(tmp_path)
    refused(main, [src, str(tmp_path / "out"), *extra], capsys, needle)
    assert tree(tmp_path) == before


def test_paddle2onnx_failure_reaches_the_user(tmp_path):
    """The converter runs in a child process: its abort or error becomes one line with its own last words."""
    from paddle_vha.export.onnx_export import ExportError, _run_paddle2onnx

    (tmp_path / "model.json").write_text("{not a program")
    (tmp_path / "model.pdiparams").write_bytes(b"")
    with pytest.raises(ExportError) as e:
        _run_paddle2onnx(str(tmp_path / "model.json"), str(tmp_path / "model.pdiparams"), str(tmp_path / "m.onnx"), 17)
    print(e.value)
    assert str(e.value).startswith("paddle2onnx failed (") and "\n" not in str(e.value)


def test_tied_embeddings_are_exported_once(tmp_path):
    import onnx

    from paddle_vha.export.onnx_export import export_onnx

    src = save_stock(tmp_path / "in", tie_word_embeddings=True, vocab_size=512)
    export_onnx(src, str(tmp_path / "out"), decode_steps=1, log=lambda m: None)
    model = onnx.load(str(tmp_path / "out" / "model.onnx"))
    stored = sum(onnx.numpy_helper.to_array(t).nbytes for t in model.graph.initializer)
    from paddle_vha.checkpoint.folder import CheckpointFolder

    weights = sum(a.nbytes for a in CheckpointFolder(src).read_all().values())
    embedding = 512 * TINY["hidden_size"] * 4
    print(f"initializers {stored} B, checkpoint {weights} B, embedding {embedding} B")
    assert stored < weights + embedding // 2, "the tied embedding is stored once"


def _children(pid: int, needle: str):
    """Live processes whose parent is `pid` and whose command line holds `needle`."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = open(f"/proc/{entry}/stat").read()
            cmd = open(f"/proc/{entry}/cmdline", "rb").read().decode(errors="replace")
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == pid and needle in cmd and fields[0] != "Z":
            found.append(int(entry))
    return found


def _alive(pid: int) -> bool:
    try:
        state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"  # a zombie has exited; only its exit status waits for a reaper


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_paddle2onnx_child_dies_with_a_killed_export(tmp_path, sig):
    """export_onnx killed while paddle2onnx converts: the converter child goes with it at once (it outlived a SIGKILLed
    parent, converting on into a removed folder), and SIGTERM ends the export with exit 143, one line and no
    temporary (PaddleFormers' import had reset the SIGTERM handler, so a kill left the temporary behind)."""
    import time

    src = save_stock(tmp_path / "in")
    env = dict(os.environ, PYTHONPATH=ROOT)
    parent = subprocess.Popen([sys.executable, "-m", "paddle_vha.cli.export_onnx", src, str(tmp_path / "out"),
                               "--decode-steps", "1"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              text=True)
    child, deadline = [], time.time() + 120
    while not child and parent.poll() is None and time.time() < deadline:
        child = _children(parent.pid, "paddle2onnx.export")
        time.sleep(0.005)
    assert child, f"no paddle2onnx child seen (export exit {parent.poll()})"
    time.sleep(0.2)  # past its start: the converter is importing / converting (several seconds on its own)
    assert _alive(child[0])
    parent.send_signal(sig)
    _, err = parent.communicate(timeout=60)
    end = time.time() + 1.0
    while _alive(child[0]) and time.time() < end:
        time.sleep(0.02)
    print(f"signal {sig}: export exit {parent.returncode}, converter {child[0]} alive 1 s later: {_alive(child[0])}; "
          f"stderr {err.strip().splitlines()[-1:]}")
    assert not _alive(child[0])
    assert not os.path.exists(tmp_path / "out")
    if sig == signal.SIGTERM:
        assert parent.returncode == 143
        assert err.strip().splitlines()[-1] == "error: terminated (SIGTERM); temporaries removed"
        assert sorted(os.listdir(tmp_path)) == ["in"]  # no .out.tmp-* left


@pytest.mark.parametrize("value", ["nan", "-1"])
def test_tolerance_is_checked_before_the_export(tmp_path, capsys, value):
    """--tolerance NaN or negative: the usage error before anything is read (NaN failed only after the export)."""
    from paddle_vha.cli.export_onnx import main

    src = save_stock(tmp_path / "in")
    before = tree(tmp_path)
    with pytest.raises(SystemExit) as e:
        main([src, str(tmp_path / "out"), "--tolerance", value])
    last = capsys.readouterr().err.strip().splitlines()[-1]
    print(last)
    assert e.value.code == 2 and f"--tolerance {float(value)}: must be a finite number >= 0" in last
    assert tree(tmp_path) == before
