"""Hostile but realistic input to tools/import_fleet.py: a tensor made twice, a fused layout nobody stated, a bad
--max-shard-size, and what --verify says it cannot check. Each refusal: one line naming the problem, exit 2, nothing
written, the input byte-identical (helpers: tests/hostile.py; checkpoints: tests/test_import_fleet.py's builders)."""
from __future__ import annotations

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from hostile import refused, tree
from test_import_fleet import make_fork


def _flags(qkv="grouped", ffn="gate-up"):
    return ["--qkv-layout", qkv, "--up-gate-order", ffn]


def test_a_separate_projection_beside_the_fused_one_is_refused_by_name(tmp_path, capsys):
    """layers.0.self_attn.q_proj.weight next to the fused qkv_proj: both make model...q_proj (one was dropped
    without a word)."""
    from paddle_vha.cli.import_fleet import main

    make_fork(tmp_path / "fork")
    path = tmp_path / "fork" / "model.safetensors"
    t = load_file(str(path))
    t["layers.0.self_attn.q_proj.weight"] = np.zeros((48, 64), np.float32)  # [in, out], the fused Q part's shape
    save_file(t, str(path))
    before = tree(tmp_path)
    line = refused(main, [str(tmp_path / "fork"), str(tmp_path / "out"), *_flags()], capsys,
                   "layers.0.self_attn.q_proj.weight: a second tensor for model.layers.0.self_attn.q_proj.weight")
    assert "qkv_proj" in line and tree(tmp_path) == before


@pytest.mark.parametrize("given, needle", [([], "pass --qkv-layout"),
                                           (["--qkv-layout", "grouped"], "pass --up-gate-order")])
def test_a_fused_layout_must_be_stated(tmp_path, capsys, given, needle):
    """Upstream's config.json does not record how qkv_proj / up_gate_proj are fused and --verify reads them under the
    same assumption (a wrong --qkv-layout verified OK at 1.41 relative off upstream's true forward): unstated, refused."""
    from paddle_vha.cli.import_fleet import main

    make_fork(tmp_path / "fork")
    before = tree(tmp_path)
    refused(main, [str(tmp_path / "fork"), str(tmp_path / "out"), *given], capsys, needle)
    assert tree(tmp_path) == before


def test_bad_max_shard_size_is_one_line(tmp_path, capsys):
    from paddle_vha.cli.import_fleet import main

    make_fork(tmp_path / "fork")
    before = tree(tmp_path)
    refused(main, [str(tmp_path / "fork"), str(tmp_path / "out"), *_flags(), "--max-shard-size", "lots"], capsys,
            "--max-shard-size")
    assert tree(tmp_path) == before


def test_verify_says_which_layout_it_assumed(tmp_path, capsys):
    """--verify's line names the fused layouts both sides read the input under, and that it cannot check them."""
    from paddle_vha.cli.import_fleet import main

    make_fork(tmp_path / "fork", qkv_layout="concat", up_gate_order="up-gate")
    assert main([str(tmp_path / "fork"), str(tmp_path / "out"), *_flags("concat", "up-gate"), "--verify", "1",
                 "--no-progress"]) == 0
    out = capsys.readouterr().out
    print(out)
    line = next(ln for ln in out.splitlines() if ln.startswith("verify"))
    assert "--qkv-layout concat and --up-gate-order up-gate, which it cannot check" in line and "OK" in line
