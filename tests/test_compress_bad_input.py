"""Hostile but realistic input, compress_kv on non-finite weights and a failing check. Each case asserts the exit code,
one line on stderr naming the problem, nothing written, and the inputs byte-identical (helpers: tests/hostile.py).
Tools run in-process through their command lines (paddle_vha/cli/*.py), which is what tools/*.py and the installed
paddle-vha-* scripts run.
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


def test_compress_refuses_nan_and_writes_nothing_when_its_check_fails(tmp_path, capsys, monkeypatch):
    from paddle_vha.cli import compress_kv
    from paddle_vha.transform import compress_kv as compress

    src = save_stock(tmp_path / "in")
    _rewrite_tensors(src, set_tensor("model.layers.1.self_attn.k_proj.weight", nan_at))
    before = tree(tmp_path)
    refused(compress_kv.main, [src, str(tmp_path / "out"), "--kv-heads", "1", "--no-progress"], capsys,
            "model.layers.1.self_attn.k_proj.weight: 1 non-finite value(s)")
    assert tree(tmp_path) == before
    src2 = save_stock(tmp_path / "in2")
    before = tree(tmp_path)

    def kl_fails(*a, **k):
        raise compress.CompressError("logit KL: the compressed model's logits are not finite (NaN or Inf)")

    monkeypatch.setattr(compress, "logit_kl", kl_fails)
    refused(compress_kv.main, [src2, str(tmp_path / "out"), "--kv-heads", "1", "--no-progress", "--eval-batches", "1"],
            capsys, "logits are not finite")
    assert tree(tmp_path) == before, "OUT appears only after the KL check passed"


def test_convert_counts_its_calibration_text_in_the_memory_refusal(tmp_path, capsys):
    """convert_to_vha --method calibrated --calib-tokens 10**12: refused up front by the memory need, which now holds
    the calibration windows drawn before the pass (they grew to 9.5 GB before the process was stopped)."""
    from paddle_vha.cli.convert_to_vha import main

    src = save_stock(tmp_path / "in")
    before = tree(tmp_path)
    line = refused(main, [src, str(tmp_path / "out"), "--kv-heads", "1", "--method", "calibrated", "--calib-tokens",
                          str(10**12), "--no-progress"], capsys, "calibration windows of 1000000000000 tokens")
    assert "refusing" in line and tree(tmp_path) == before


def test_convert_seed_range_is_checked(tmp_path, capsys):
    """convert_to_vha --seed -5: the usage error (numpy's ValueError traceback before)."""
    from paddle_vha.cli.convert_to_vha import main

    src = save_stock(tmp_path / "in")
    before = tree(tmp_path)
    with pytest.raises(SystemExit) as e:
        main([src, str(tmp_path / "out"), "--kv-heads", "1", "--seed", "-5"])
    last = capsys.readouterr().err.strip().splitlines()[-1]
    print(last)
    assert e.value.code == 2 and "--seed -5: must be in [0, 2**32)" in last and tree(tmp_path) == before


@pytest.mark.parametrize("dry", [True, False])
def test_compress_to_kv_heads_that_do_not_divide_the_query_heads(tmp_path, capsys, dry):
    """--kv-heads 4 of 6 KV heads over 6 query heads: an MEA layer groups its queries by the n_v = 6 virtual heads HLC
    composes, so 4 physical heads need not divide them (the MEA oracle tests run n_p = 3 under 10 query heads). The
    plan's cost line applied GQA's 'num_heads a multiple of num_kv_heads' to the physical heads: an uncaught ArchError
    traceback, with --dry-run too. Now planned, written and its KL measured."""
    from paddle_vha.cli import compress_kv
    from paddle_vha.accounting import arch_from_config, kv_bytes_per_token

    src = save_stock(tmp_path / "in", num_attention_heads=6, num_key_value_heads=6, head_dim=8)
    before = tree(tmp_path / "in")
    out = tmp_path / "out"
    rc = compress_kv.main([src, str(out), "--kv-heads", "4", "--eval-batches", "1"]
                          + (["--dry-run"] if dry else ["--no-progress"]))
    printed = capsys.readouterr().out
    print(printed[-800:])
    assert rc == 0 and "KV heads there 6 -> 4 physical" in printed and "512 B (66.7%)" in printed
    assert tree(tmp_path / "in") == before
    if dry:
        assert not out.exists()
        return
    cfg = json.load(open(out / "config.json"))
    arch = arch_from_config(cfg)
    assert (cfg["num_key_value_heads"], cfg["mea_kv_heads"]) == (4, 6) and arch.num_kv_heads == 4
    assert kv_bytes_per_token(arch, 4) == 2 * 4 * 8 * 4  # K and V of 4 heads of 8, float32, per layer
    assert "logit KL(original || compressed)" in printed


def test_compress_k_norm_position_over_a_base_without_k_norm(tmp_path, capsys):
    """--k-norm over a Llama checkpoint (no k_norm: both positions are the same function) has no effect: refused in
    one line naming the checkpoint's base, before anything is written; over Qwen3 it is taken."""
    from test_bases import save_model
    from paddle_vha.cli import compress_kv

    save_model("llama", tmp_path / "llama")
    before = tree(tmp_path)
    refused(compress_kv.main, [str(tmp_path / "llama"), str(tmp_path / "out"), "--kv-heads", "1", "--k-norm",
                               "before", "--dry-run"], capsys, "--k-norm has no effect in this run")
    assert tree(tmp_path) == before
    assert compress_kv.main([str(tmp_path / "llama"), str(tmp_path / "out"), "--kv-heads", "1", "--dry-run"]) == 0
    src = save_stock(tmp_path / "qwen3")
    assert compress_kv.main([src, str(tmp_path / "out"), "--kv-heads", "1", "--k-norm", "before", "--dry-run"]) == 0
