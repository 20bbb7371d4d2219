"""Hostile but realistic input, fold's command line on damaged checkpoints and bad options, and its --verify on non-
finite logits. Each case asserts the exit code, one line on stderr naming the problem, nothing written, and the
inputs byte-identical (helpers: tests/hostile.py). Tools run in-process through their command lines
(paddle_vha/cli/*.py), which is what tools/*.py and the installed paddle-vha-* scripts run.
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


FOLD_CASES = {
    # input damaged in ways the safetensors library or a shallow check lets through
    "nan-in-folded-tensor": (lambda p: _rewrite_tensors(p, set_tensor("model.layers.0.self_attn.q_proj.weight", nan_at)),
                             [], "model.layers.0.self_attn.q_proj.weight: 1 non-finite value(s)"),
    "inf-in-copied-tensor": (lambda p: _rewrite_tensors(p, set_tensor("model.embed_tokens.weight",
                                                                       lambda a: a + np.float32(np.inf))),
                             [], "model.embed_tokens.weight"),
    "fp16-overflow": (lambda p: _rewrite_tensors(p, set_tensor("model.layers.1.mlp.up_proj.weight", lambda a: a * 1e9)),
                      ["--dtype", "float16"], "overflow float16"),
    "index-not-object": (lambda p: edit_index(p, lambda d: d.update(weight_map=[1, 2])), [], "no \"weight_map\" object"),
    "shard-not-string": (lambda p: edit_index(p, lambda d: d["weight_map"].update({"model.norm.weight": 7})), [],
                         "not a file name"),
    "shard-outside": (lambda p: edit_index(p, lambda d: d["weight_map"].update({"model.norm.weight": "../x.safetensors"})),
                      [], "not a file name inside the folder"),
    "index-not-utf8": (lambda p: edit_index(p, lambda d: b"\xff\xfe{}"), [], "malformed index"),
    "tensor-named-twice": (lambda p: edit_index(p, lambda d: (
        '{"metadata": {}, "weight_map": {"model.norm.weight": "a", "model.norm.weight": "b"}}').encode()), [],
        "names a tensor twice: model.norm.weight"),
    "fifo-side-file": (lambda p: os.mkfifo(os.path.join(p, "tokenizer.json")), [], "not a regular file or folder"),
    "layers-float": (lambda p: edit_config(p, num_hidden_layers=2.0), [], "num_hidden_layers"),
    "null-size": (lambda p: edit_config(p, intermediate_size=None), [], "intermediate_size must be a positive int"),
    "string-heads": (lambda p: edit_config(p, num_attention_heads="4"), [], "num_attention_heads"),
    "rope-theta-zero": (lambda p: edit_config(p, rope_theta=0, rope_parameters={"rope_type": "default", "rope_theta": 0}),
                        [], "rope_theta must be a positive finite number"),
    "negative-eps": (lambda p: edit_config(p, rms_norm_eps=-1e-6), [], "rms_norm_eps must be a positive finite number"),
    "nan-eps": (lambda p: edit_config(p, rms_norm_eps=float("nan")), [], "rms_norm_eps"),
    "huge-shard-size": (lambda p: None, ["--max-shard-size", "1e400GB"], "too large"),
}


@pytest.mark.parametrize("case", list(FOLD_CASES))
def test_fold_refuses_hostile_input(tmp_path, capsys, case):
    from paddle_vha.cli.fold import main

    src = save_vha(tmp_path / "in")
    damage, extra, needle = FOLD_CASES[case]
    damage(src)
    before = tree(tmp_path)
    refused(main, [src, str(tmp_path / "out"), "--no-progress", *extra], capsys, needle)
    assert tree(tmp_path) == before, "nothing written, input untouched"


def test_fold_verify_fails_on_non_finite_logits(tmp_path, capsys, monkeypatch):
    from paddle_vha.cli.fold import main
    from paddle_vha.transform import fold

    src = save_vha(tmp_path / "in")
    monkeypatch.setattr(fold, "verify_fold", lambda *a, **k: {"max_abs": math.nan, "max_rel": math.nan,
                                                               "mean_kl": math.nan, "nonfinite": "compared"})
    refused(main, [src, str(tmp_path / "out"), "--no-progress", "--verify", "1"], capsys,
            "the folded model's logits are not finite", code=1)


def test_compare_logits_reports_non_finite():
    from paddle_vha.evaluate import compare_logits

    a = np.zeros((1, 2, 5))
    b = a.copy()
    b[0, 1, 2] = np.nan
    assert compare_logits(a, a)["nonfinite"] == "" and compare_logits(a, a)["max_abs"] == 0.0
    r = compare_logits(a, b)
    assert r["nonfinite"] == "compared" and math.isnan(r["max_rel"])


def _swap_for(path, kind):
    """Replace the file `path` by something that is not a readable regular file of that name."""
    os.remove(path)
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "device":
        os.symlink("/dev/zero", path)
    elif kind == "folder":
        os.mkdir(path)
    elif kind == "loop":
        os.symlink(os.path.basename(path), path)
    elif kind == "dangling":
        os.symlink(path + ".gone", path)


NOT_A_FILE = {"fifo": "a FIFO", "device": "a device", "folder": "a directory", "loop": "a symlink loop",
              "dangling": "a dangling symlink"}


@pytest.mark.parametrize("kind", list(NOT_A_FILE))
@pytest.mark.parametrize("which", ["config.json", "shard"])
def test_config_or_shard_that_is_not_a_file_is_named(tmp_path, capsys, kind, which):
    """config.json or a shard that exists but is a FIFO, /dev/zero, a folder or a link loop: one line saying what it
    is (it used to read "missing", or block forever on the FIFO), nothing written."""
    from paddle_vha.cli.fold import main

    src = save_vha(tmp_path / "in")
    name = "config.json" if which == "config.json" else next(f for f in os.listdir(src) if f.endswith(".safetensors"))
    _swap_for(os.path.join(src, name), kind)
    before = tree(tmp_path)
    line = refused(main, [src, str(tmp_path / "out"), "--no-progress"], capsys, name)
    assert NOT_A_FILE[kind] in line, line
    assert tree(tmp_path) == before


@pytest.mark.parametrize("case,needle", [("deep", "nested too deeply"), ("digits", "not usable JSON")])
def test_config_json_bombs_are_refused_in_one_line(tmp_path, capsys, case, needle):
    """A config.json nested 100,000 deep or holding a 5,000-digit integer: one line (RecursionError / ValueError
    tracebacks before)."""
    from paddle_vha.cli.fold import main

    src = save_vha(tmp_path / "in")
    text = "[" * 100000 + "]" * 100000 if case == "deep" else '{"num_hidden_layers": ' + "9" * 5000 + "}"
    with open(os.path.join(src, "config.json"), "w") as f:
        f.write(text)
    before = tree(tmp_path)
    refused(main, [src, str(tmp_path / "out"), "--no-progress"], capsys, needle)
    assert tree(tmp_path) == before


@pytest.mark.parametrize("tool", ["fold", "compress_kv"])
@pytest.mark.parametrize("field,value,needle", [("rope_parameters", "default", "rope_parameters must be an object"),
                                                ("rope_scaling", "linear", "rope_scaling must be an object"),
                                                ("hidden_act", "gelu_fancy", "hidden_act 'gelu_fancy'"),
                                                ("tie_word_embeddings", "false",
                                                 "tie_word_embeddings must be true or false, got 'false'")])
def test_config_fields_of_the_wrong_kind_are_named(tmp_path, capsys, tool, field, value, needle):
    """A RoPE scaling given as a string, an activation PaddleFormers does not have, a flag given as the string
    "false" (a true value: it read as an unexpected lm_head tensor): one line naming the field (an AttributeError's
    words, or accepted, before)."""
    from paddle_vha.cli import compress_kv, fold

    src = save_vha(tmp_path / "in") if tool == "fold" else save_stock(tmp_path / "in")
    edit_config(src, **{field: value})
    extra = ["--kv-heads", "1", "--eval-batches", "0"] if tool == "compress_kv" else []
    before = tree(tmp_path)
    main = fold.main if tool == "fold" else compress_kv.main
    refused(main, [src, str(tmp_path / "out"), "--no-progress", *extra], capsys, needle)
    assert tree(tmp_path) == before


@pytest.mark.parametrize("kind", ["loop", "dangling", "fifo"])
@pytest.mark.parametrize("tool", ["fold", "export_onnx"])
def test_side_file_that_is_not_a_file_is_named(tmp_path, capsys, tool, kind):
    """A side file (tokenizer_config.json) that is a link loop, a dangling link or a FIFO: one line naming it and what
    it is, before any work (fold: an OSError traceback; the export skipped it silently after converting)."""
    import importlib

    main = importlib.import_module(f"paddle_vha.cli.{tool}").main
    src = save_vha(tmp_path / "in") if tool == "fold" else save_stock(tmp_path / "in")
    side = os.path.join(src, "tokenizer_config.json")
    open(side, "w").write("{}")
    _swap_for(side, kind)
    before = tree(tmp_path)
    line = refused(main, [src, str(tmp_path / "out")], capsys, "tokenizer_config.json")
    assert NOT_A_FILE[kind] in line, line
    assert tree(tmp_path) == before


@pytest.mark.parametrize("value", ["nan", "-1"])
def test_verify_tolerance_is_checked_before_the_job(tmp_path, capsys, value):
    """--verify-tol NaN or negative: refused with the usage error before anything is read (NaN failed every
    comparison only after the fold was written and verified)."""
    from paddle_vha.cli.fold import main

    src = save_vha(tmp_path / "in")
    before = tree(tmp_path)
    with pytest.raises(SystemExit) as e:
        main([src, str(tmp_path / "out"), "--verify", "1", "--verify-tol", value])
    last = capsys.readouterr().err.strip().splitlines()[-1]
    print(last)
    assert e.value.code == 2 and f"--verify-tol {float(value)}: must be a finite number >= 0" in last
    assert tree(tmp_path) == before
