"""Hostile but realistic input, merge_tp_checkpoint on rank files that disagree with their tp_plan.json. Each case
asserts the exit code, one line on stderr naming the input rank file and the problem, nothing written, and the
inputs byte-identical (helpers: tests/hostile.py)."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from hostile import refused, save_vha, tree


def _sharded(tmp_path):
    from tools.fixtures.tp_split import split

    src = save_vha(tmp_path / "vha")
    split(src, str(tmp_path / "shards"), 2)
    plan = json.load(open(tmp_path / "shards" / "tp_plan.json"))
    return str(tmp_path / "shards"), plan


def _rank(shards, k):
    return os.path.join(shards, f"tp-rank-{k:02d}-of-02.safetensors")


def _edit_rank(shards, k, fn):
    path = _rank(shards, k)
    tensors = load_file(path)
    fn(tensors)
    save_file(tensors, path)


def _split_name(plan):
    return next(n for n, i in plan["tensors"].items() if i["axis"] is not None and i["dtype"] == "F32")


def _whole_name(plan):
    return next(n for n, i in plan["tensors"].items() if i["axis"] is None)


def _as_f16(name):
    return lambda t: t.update({name: t[name].astype(np.float16)})


CASES = {
    # a split tensor's part in float16 where the plan says float32: merged with "checkpoint contract: ok" (cast)
    "one-rank-float16": (lambda s, p: _edit_rank(s, 1, _as_f16(_split_name(p))),
                         lambda s, p: f"tp-rank-01-of-02.safetensors: {_split_name(p)} is F16, tp_plan.json says F32"),
    # every rank's part in float16: the error named the temporary output file, not an input shard
    "every-rank-float16": (lambda s, p: [_edit_rank(s, k, _as_f16(_split_name(p))) for k in (0, 1)],
                           lambda s, p: f"tp-rank-00-of-02.safetensors: {_split_name(p)} is F16"),
    # a whole tensor stored again, with other values, by rank 1: ignored
    "whole-tensor-on-rank-1": (lambda s, p: _edit_rank(s, 1, lambda t: t.update(
        {_whole_name(p): load_file(_rank(s, 0))[_whole_name(p)] + 1})),
        lambda s, p: f"tp-rank-01-of-02.safetensors: holds {_whole_name(p)}, which tp_plan.json says rank 0 stores "
                     "whole"),
    # a tensor the plan does not list: dropped without a word
    "tensor-not-in-plan": (lambda s, p: _edit_rank(s, 0, lambda t: t.update({"model.extra.weight": np.ones(4, "f4")})),
                           lambda s, p: "tp-rank-00-of-02.safetensors: holds model.extra.weight, which tp_plan.json "
                                        "does not list"),
    # a part of the wrong size on one rank
    "short-part": (lambda s, p: _edit_rank(s, 1, lambda t: t.update({_split_name(p): t[_split_name(p)][:-1]})),
                   lambda s, p: f"tp-rank-01-of-02.safetensors: {_split_name(p)} has shape"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_merge_checks_every_rank_against_the_plan(tmp_path, capsys, case):
    from paddle_vha.cli.merge_tp_checkpoint import main

    shards, plan = _sharded(tmp_path)
    damage, words = CASES[case]
    damage(shards, plan)
    before = tree(tmp_path)
    line = refused(main, [shards, str(tmp_path / "merged")], capsys, words(shards, plan))
    assert shards in line  # the input rank file, by its path
    assert tree(tmp_path) == before and not (tmp_path / "merged").exists()


def test_an_intact_sharded_save_still_merges(tmp_path, capsys):
    from paddle_vha.cli.merge_tp_checkpoint import main
    from paddle_vha.checkpoint.folder import CheckpointFolder

    shards, plan = _sharded(tmp_path)
    assert main([shards, str(tmp_path / "merged")]) == 0
    a, b = CheckpointFolder(str(tmp_path / "vha")).read_all(), CheckpointFolder(str(tmp_path / "merged")).read_all()
    assert sorted(a) == sorted(b) and all(np.array_equal(a[k], b[k]) and a[k].dtype == b[k].dtype for k in a)
