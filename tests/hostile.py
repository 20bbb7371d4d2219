"""Helpers of the hostile-input tests (tests/test_*_bad_input.py, tests/test_output_folders.py): damage a checkpoint,
run a tool's command line in-process, and check that it refused with one line and left its inputs byte-identical."""
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

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def tree(path) -> dict:
    """{relative path: sha256 or 'dir' or 'special'} of everything under `path`: inputs must come back identical."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(path):
        for d in dirnames:
            out[os.path.relpath(os.path.join(dirpath, d), path)] = "dir"
        for f in filenames:
            full = os.path.join(dirpath, f)
            if os.path.isfile(full) and not os.path.islink(full):
                out[os.path.relpath(full, path)] = hashlib.sha256(open(full, "rb").read()).hexdigest()
            else:
                out[os.path.relpath(full, path)] = "special"
    return out


def refused(main, argv, capsys, needle, code=2):
    """main(argv) ends with `code` (returned or raised), stderr's last word is one line containing `needle`."""
    try:
        rc = main(argv)
    except SystemExit as e:
        rc = e.code
    err = capsys.readouterr().err.strip()
    lines = [ln for ln in err.splitlines() if ln.startswith("error:")]
    print(err)
    assert rc == code, (rc, err)
    assert len(lines) == 1 and needle in lines[0], err
    return lines[0]


def save_vha(path, **overrides):
    paddle.seed(3)
    from paddle_vha import Qwen3VHAForCausalLM

    model = Qwen3VHAForCausalLM(tiny_config(**overrides))
    model.save_pretrained(str(path))
    return str(path)


def save_stock(path, **overrides):
    from paddleformers.transformers import Qwen3Config, Qwen3ForCausalLM

    paddle.seed(4)
    cfg = dict(TINY, num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)
    cfg.update(overrides)
    Qwen3ForCausalLM(Qwen3Config(**cfg)).save_pretrained(str(path))
    return str(path)


def edit_config(path, **changes):
    p = os.path.join(path, "config.json")
    cfg = json.load(open(p))
    cfg.update(changes)
    with open(p, "w") as f:
        f.write(json.dumps(cfg, allow_nan=True))


def edit_index(path, fn):
    p = os.path.join(path, "model.safetensors.index.json")
    data = json.load(open(p))
    text = fn(data)
    with open(p, "wb") as f:
        f.write(text if isinstance(text, bytes) else json.dumps(data).encode())


def set_tensor(name, fn):
    return lambda t: t.update({name: fn(t[name].copy())})


def nan_at(a):
    a.reshape(-1)[3] = np.nan
    return a
