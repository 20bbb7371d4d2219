"""Hostile but realistic input, generate on broken exports, long prompts and non-finite logits. Each case asserts the
exit code, one line on stderr naming the problem, nothing written, and the inputs byte-identical (helpers:
tests/hostile.py). Tools run in-process through their command lines (paddle_vha/cli/*.py), which is what tools/*.py
and the installed paddle-vha-* scripts run.
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


@pytest.fixture(scope="module")
def export_dir(tmp_path_factory):
    from paddle_vha.export.onnx_export import export_onnx

    root = tmp_path_factory.mktemp("gen")
    src = save_stock(root / "in", max_position_embeddings=32)
    export_onnx(src, str(root / "out"), decode_steps=1, log=lambda m: None)
    return str(root / "out")


GENERATE_CASES = {
    "no-info": (lambda d: os.remove(os.path.join(d, "export_info.json")), "no export_info.json"),
    "broken-info": (lambda d: open(os.path.join(d, "export_info.json"), "w").write("{"), "not valid JSON"),
    "info-not-object": (lambda d: open(os.path.join(d, "export_info.json"), "w").write("[]"), "expected a JSON object"),
    "no-model": (lambda d: os.remove(os.path.join(d, "model.onnx")), "missing or empty"),
    "empty-model": (lambda d: open(os.path.join(d, "model.onnx"), "w").close(), "missing or empty"),
    "truncated-model": (lambda d: open(os.path.join(d, "model.onnx"), "r+b").truncate(300), "onnxruntime cannot load it"),
    # export_info.json claiming the in-place flavour for a concat graph (a ValueError traceback from numpy)
    "lying-cache-io": (lambda d: edit_json(os.path.join(d, "export_info.json"), cache_io="buffer"),
                       "export_info.json does not describe this model.onnx"),
}


def edit_json(path, **changes):
    data = json.load(open(path))
    data.update(changes)
    with open(path, "w") as f:
        json.dump(data, f)


@pytest.mark.parametrize("case", list(GENERATE_CASES))
def test_generate_refuses_broken_exports(tmp_path, capsys, export_dir, case):
    import shutil

    from paddle_vha.cli.generate import main

    d = str(tmp_path / "e")
    shutil.copytree(export_dir, d)
    damage, needle = GENERATE_CASES[case]
    damage(d)
    before = tree(tmp_path)
    refused(main, [d, "--prompt-ids", "1,2,3", "--max-new-tokens", "2"], capsys, needle)
    assert tree(tmp_path) == before


@pytest.mark.parametrize("new,needle", [("30", "ask for at most --max-new-tokens 29"),
                                         (str(10**9), "--max-new-tokens 1000000000 pass the export's context of 32")])
def test_generate_refuses_to_pass_the_context(capsys, export_dir, new, needle):
    """Prompt + --max-new-tokens past the export's context (max_position_embeddings 32 here) is one refusal before
    anything loads, naming the most that fits (it was a warning, and 10**9 ran unbounded); exactly the context runs."""
    from paddle_vha.cli.generate import main

    refused(main, [export_dir, "--prompt-ids", "1,2,3", "--max-new-tokens", new], capsys, needle)
    assert main([export_dir, "--prompt-ids", "1,2,3", "--max-new-tokens", "29", "--ignore-eos"]) == 0
    out = capsys.readouterr()
    assert "29 new tokens" in out.err and "warning" not in out.err


def test_generation_stops_on_non_finite_logits():
    from paddle_vha.serve.generate import generate
    from paddle_vha.serve.session import ServeError

    class NaNSession:
        def prefill(self, ids, mask):
            return np.full((ids.shape[0], ids.shape[1], 7), np.nan, np.float32), None

    with pytest.raises(ServeError, match="not finite .* at generation step 1"):
        generate(NaNSession(), np.ones((1, 3), np.int64), 4)


@pytest.mark.parametrize("argv,needle", [(["--threads", "100000"], "--threads 100000"),
                                         (["--seed", "-1"], "--seed -1"),
                                         (["--sample", "--temperature", "inf"], "--temperature inf"),
                                         (["--temperature", "0.5"], "only apply with --sample"),
                                         (["--top-p", "0.5"], "only apply with --sample")])
def test_generate_option_ranges(capsys, export_dir, argv, needle):
    """Options out of range are refused in one line before loading (--threads 100000 used to segfault after 73 s,
    --seed -1 raised a traceback, --temperature inf was accepted, sampling flags without --sample were ignored)."""
    from paddle_vha.cli.generate import main

    with pytest.raises(SystemExit) as e:
        main([export_dir, "--prompt-ids", "1,2,3", "--max-new-tokens", "2", *argv])
    err = capsys.readouterr().err.strip().splitlines()
    print(err[-1])
    assert e.value.code == 2 and needle in err[-1]


def test_generate_refuses_a_cache_bigger_than_memory(capsys, export_dir, monkeypatch):
    """A KV cache bigger than the memory available is refused before the runtime allocates, naming its size."""
    import paddle_vha.machine as machine
    from paddle_vha.cli.generate import main

    monkeypatch.setattr(machine, "available_memory_bytes", lambda: 1 << 10)
    refused(main, [export_dir, "--prompt-ids", "1,2,3", "--max-new-tokens", "20"], capsys, "KV cache")


def test_generate_refuses_a_prompt_that_is_not_utf8(capsys, export_dir):
    """argv bytes that are not UTF-8 (they arrive as lone surrogates) are refused in one line (it was a traceback)."""
    from paddle_vha.cli.generate import main

    refused(main, [export_dir, "--prompt", "def \udcff", "--max-new-tokens", "2"], capsys, "not valid UTF-8")


def test_generate_refuses_a_truncated_paddle_program(tmp_path, capsys, export_dir):
    """--runtime paddle on a truncated paddle/model.pdiparams: one line naming the files (it was Paddle's
    traceback from create_predictor)."""
    import shutil

    from paddle_vha.cli.generate import main

    d = str(tmp_path / "e")
    shutil.copytree(export_dir, d)
    params = os.path.join(d, "paddle", "model.pdiparams")
    os.truncate(params, os.path.getsize(params) // 2)
    before = tree(tmp_path)
    refused(main, [d, "--prompt-ids", "1,2,3", "--max-new-tokens", "2", "--runtime", "paddle"], capsys,
            "Paddle Inference cannot load them")
    assert tree(tmp_path) == before


@pytest.mark.parametrize("gen,argv,needle", [
    (dict(do_sample=True, temperature=0), ["--sample"], "temperature 0 (from generation_config.json's temperature)"),
    (dict(do_sample=True, top_p=1.5), ["--sample"], "top_p 1.5 (from generation_config.json's top_p)"),
    (dict(do_sample=True, temperature=0.7), ["--sample", "--top-p", "0"], "top_p 0.0 (from --top-p)"),
])
def test_sampling_values_are_refused_naming_where_they_came_from(tmp_path, capsys, export_dir, gen, argv, needle):
    """A sampling value out of range read from generation_config.json was refused as if typed ("need temperature > 0
    ... got 0"), without saying it came from the folder."""
    import shutil

    from paddle_vha.cli.generate import main

    d = str(tmp_path / "e")
    shutil.copytree(export_dir, d)
    with open(os.path.join(d, "generation_config.json"), "w") as f:
        json.dump(gen, f)
    before = tree(tmp_path)
    refused(main, [d, "--prompt-ids", "1,2,3", "--max-new-tokens", "2", *argv], capsys, needle)
    assert tree(tmp_path) == before
