"""Hostile but realistic input, the output-folder rules every writing tool shares: never over an input or a foreign
folder, temporaries of dead runs only, one winner among concurrent writers, Ctrl-C, and merge's checked rank-file
reader. Each case asserts the exit code, one line on stderr naming the problem, nothing written, and the inputs
byte-identical (helpers: tests/hostile.py). Tools run in-process through their command lines (paddle_vha/cli/*.py),
which is what tools/*.py and the installed paddle-vha-* scripts run.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import paddle
import pytest

from _utils import TINY, tiny_config
from paddle_vha.checkpoint.fsutil import MARKER
from test_checkpoint import _rewrite_tensors
from hostile import ROOT, edit_config, edit_index, nan_at, refused, save_stock, save_vha, set_tensor, tree


@pytest.mark.parametrize("where", ["same", "parent", "cwd", "foreign"])
def test_outputs_never_overwrite_inputs_or_foreign_folders(tmp_path, capsys, monkeypatch, where):
    """fold, compress_kv, export and merge share one output rule: OUT is not an input, does not contain one, is not the
    current folder, and --force replaces only a folder this project wrote."""
    from paddle_vha.cli import compress_kv, export_onnx, fold, merge_tp_checkpoint

    work = tmp_path / "work"
    (work / "here").mkdir(parents=True)
    (work / "here" / "notes.txt").write_text("unrelated")
    vha, stock = save_vha(work / "vha"), save_stock(work / "stock")
    shards = fake_shards(work / "shards")
    (work / "foreign").mkdir()
    (work / "foreign" / "keep.txt").write_text("keep")
    monkeypatch.chdir(work / "here")
    before = tree(tmp_path)
    needle = {"same": "must be a different folder", "parent": "must be a different folder", "cwd": "current folder",
              "foreign": "was not written by paddle-vha"}[where]
    for tool, src, argv in ((fold, vha, []), (compress_kv, stock, ["--kv-heads", "1"]), (export_onnx, stock, []),
                            (merge_tp_checkpoint, shards, [])):
        out = {"same": src, "parent": str(work), "cwd": ".", "foreign": str(work / "foreign")}[where]
        refused(tool.main, [src, out, "--force", *argv], capsys, needle)
        assert tree(tmp_path) == before, f"{tool.__name__}: nothing may change"


@pytest.mark.parametrize("into", ["out", "temporary"])
@pytest.mark.parametrize("what", ["shard", "config.json"])
def test_no_input_file_reached_through_a_link_into_out(tmp_path, capsys, into, what):
    """An input whose shard or side file is a symlink into OUT (or into a temporary of OUT that the next run deletes):
    every tool that writes refuses before --force replaces OUT, which would take the input's only copy with it."""
    from paddle_vha.cli import compress_kv, convert_to_vha, export_onnx, fold, import_fleet, merge_tp_checkpoint
    from test_import_fleet import make_fork

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    work = tmp_path / "work"
    work.mkdir()
    make_fork(str(work / "fork"))
    cases = ((fold, save_vha(work / "vha"), []), (compress_kv, save_stock(work / "stock"), ["--kv-heads", "1"]),
             (convert_to_vha, save_stock(work / "stock2"), ["--kv-heads", "1", "--no-compare"]),
             (export_onnx, save_stock(work / "stock3"), []), (merge_tp_checkpoint, fake_shards(work / "shards"), []),
             (import_fleet, str(work / "fork"), ["--qkv-layout", "grouped", "--up-gate-order", "gate-up"]))
    for n, (tool, src, argv) in enumerate(cases):
        out = work / f"out{n}"
        out.mkdir()
        (out / MARKER).write_text(json.dumps({"tool": "fold", "pid": os.getpid(), "host": socket.gethostname()}))
        holder = out
        if into == "temporary":  # a temporary of a dead run into OUT: atomic_dir removes it first
            holder = work / f".out{n}.tmp-dead"
            holder.mkdir()
            (holder / MARKER).write_text(json.dumps({"tool": "fold", "pid": dead.pid, "host": socket.gethostname(),
                                                     "start": None}))
        name = what if what == "config.json" else sorted(f for f in os.listdir(src) if f.endswith(".safetensors"))[0]
        os.rename(os.path.join(src, name), holder / name)
        os.symlink(holder / name, os.path.join(src, name))
        before = tree(tmp_path)
        line = refused(tool.main, [src, str(out), "--force", *argv], capsys, "writing there would destroy the input")
        assert name in line and tree(tmp_path) == before, f"{tool.__name__}: nothing may change"


def fake_shards(path, poison=None):
    """A tensor-parallel sharded save of a tiny Qwen3-VHA model, as save_tp_checkpoint writes it (t = 2);
    poison=(rank, value): that rank's first split tensor gets `value` (NaN, Inf) at one element."""
    from paddle_vha import Qwen3VHAForCausalLM
    from paddle_vha.checkpoint import safetensors_io as st
    from paddle_vha.parallel.tp_shards import FORMAT, PLAN_FILE

    paddle.seed(5)
    model = Qwen3VHAForCausalLM(tiny_config())
    os.makedirs(path)
    model.config.save_pretrained(str(path))
    state = {n: p.numpy() for n, p in model.named_parameters()}
    tensors, parts = {}, [{}, {}]
    for n, a in state.items():
        if n.endswith("_proj.weight"):
            a = np.ascontiguousarray(a.T)
        axis = 0 if n.endswith("mlp.down_proj.weight") else None
        tensors[n] = {"shape": list(a.shape), "dtype": "F32", "axis": axis}
        if axis is None:
            parts[0][n] = a
        else:
            for k, piece in enumerate(np.split(a, 2, axis=axis)):
                parts[k][n] = np.ascontiguousarray(piece)
    if poison is not None:
        split = next(n for n in tensors if tensors[n]["axis"] is not None)
        parts[poison[0]][split].flat[7] = poison[1]
    files = [f"tp-rank-{k:02d}-of-02.safetensors" for k in range(2)]
    for f, part in zip(files, parts):
        w = st.ShardWriter(os.path.join(path, f), [(n, "F32", a.shape) for n, a in part.items()])
        for n, a in part.items():
            w.write(n, a)
        w.close()
    with open(os.path.join(path, PLAN_FILE), "w") as fh:
        json.dump({"format": FORMAT, "tensor_parallel_size": 2, "files": files, "tensors": tensors}, fh)
    return str(path)


@pytest.mark.parametrize("value", [float("nan"), float("inf")], ids=["nan", "inf"])
def test_merge_refuses_non_finite_shards(tmp_path, capsys, value):
    """A rank file holding a NaN / Inf is refused naming the rank file (it used to merge with "contract: ok")."""
    from paddle_vha.cli.merge_tp_checkpoint import main

    shards = fake_shards(tmp_path / "shards", poison=(1, value))
    before = tree(tmp_path)
    line = refused(main, [shards, str(tmp_path / "merged")], capsys, "tp-rank-01-of-02.safetensors")
    assert "non-finite" in line and "refusing to merge" in line
    assert tree(tmp_path) == before


def test_merge_reads_rank_files_with_the_checked_reader(tmp_path, capsys):
    """A rank file whose tensors overlap (a norm weight holding another tensor's bytes) is refused, not merged."""
    from paddle_vha.cli.merge_tp_checkpoint import main

    shards = fake_shards(tmp_path / "shards")
    assert main([shards, str(tmp_path / "ok")]) == 0  # the well-formed save merges and validates
    capsys.readouterr()
    rank0 = os.path.join(shards, "tp-rank-00-of-02.safetensors")
    n = int.from_bytes(open(rank0, "rb").read(8), "little")
    header = json.loads(open(rank0, "rb").read(8 + n)[8:])
    a, b = [k for k in header if k.endswith("norm.weight")][:2]
    header[b]["data_offsets"] = header[a]["data_offsets"]  # b now reads a's bytes
    raw = json.dumps(header).encode()
    data = open(rank0, "rb").read()[8 + n:]
    with open(rank0, "wb") as f:
        f.write(len(raw).to_bytes(8, "little") + raw + data)
    before = tree(tmp_path)
    refused(main, [shards, str(tmp_path / "merged")], capsys, "unreadable safetensors file")
    assert tree(tmp_path) == before


def test_stale_temporary_of_a_dead_run_is_removed(tmp_path, capsys):
    """kill -9 during a write leaves .OUT.tmp-*; the next run into OUT removes it, says so in one line, and writes."""
    from paddle_vha.cli.fold import main

    src = save_vha(tmp_path / "in")
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    stale = tmp_path / ".out.tmp-dead"
    stale.mkdir()
    (stale / "model-00001-of-00001.safetensors").write_bytes(b"\0" * 4096)
    (stale / MARKER).write_text(json.dumps({"tool": "fold", "pid": child.pid, "host": socket.gethostname(),
                                            "start": None}))
    live = tmp_path / ".out.tmp-live"  # a run still writing: left alone
    live.mkdir()
    (live / MARKER).write_text(json.dumps({"tool": "fold", "pid": os.getpid(), "host": socket.gethostname(),
                                           "start": None}))
    child.send_signal(signal.SIGKILL)
    child.wait()
    assert main([src, str(tmp_path / "out"), "--no-progress"]) == 0
    err = capsys.readouterr().err
    print(err)
    assert not stale.exists() and live.exists()
    assert [ln for ln in err.splitlines() if "interrupted earlier run" in ln] == [
        f"note: removed {stale}, left by an interrupted earlier run (its process is gone)"]


def test_cleanup_removes_only_what_it_can_prove_it_made(tmp_path, capsys):
    """Folders named like our temporaries but without proof (no marker, a marker of another host or without a host,
    an unreadable one) are a user's: kept, however old, and the run still writes its output."""
    from paddle_vha.cli.fold import main

    src = save_vha(tmp_path / "in")
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()  # a pid that is gone
    markers = {"notes": None, "other-host": {"tool": "fold", "pid": child.pid, "host": "elsewhere", "start": None},
               "old-format": {"tool": "fold", "pid": child.pid, "start": None}, "garbage": "{not json"}
    kept = []
    for suffix, marker in markers.items():
        d = tmp_path / f".out.tmp-{suffix}"
        d.mkdir()
        (d / "my-notes.txt").write_text("mine")
        if marker is not None:
            (d / MARKER).write_text(marker if isinstance(marker, str) else json.dumps(marker))
        os.utime(d, (time.time() - 3 * 86400,) * 2)  # three days old
        kept.append(d)
    assert main([src, str(tmp_path / "out"), "--no-progress"]) == 0
    err = capsys.readouterr().err
    print(err)
    assert all((d / "my-notes.txt").read_text() == "mine" for d in kept)
    assert "interrupted earlier run" not in err


def test_concurrent_writer_loses_with_one_line(tmp_path):
    """Two runs into one new OUT: the one that finishes second fails and replaces nothing."""
    from paddle_vha.transform.fold import FoldError, fold_checkpoint, plan_fold

    src = save_vha(tmp_path / "in")
    out = tmp_path / "out"
    plan = plan_fold(src, str(out))
    first = {}

    def other_run_finishes_first(entry):
        if not first:
            first["done"] = True
            fold_checkpoint(plan_fold(src, str(out)), progress=False)

    with pytest.raises(FoldError, match="appeared while this run was writing it"):
        fold_checkpoint(plan, progress=False, on_tensor=other_run_finishes_first)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in", "out"]  # the winner's folder, no temporaries
    assert os.path.isfile(out / MARKER)


def test_ctrl_c_exits_130_with_one_line(tmp_path, capsys, monkeypatch):
    from paddle_vha.cli import fold as fold_cli
    from paddle_vha.transform import fold

    src = save_vha(tmp_path / "in")
    before = tree(tmp_path)

    def interrupted(plan, progress=True, **kw):
        raise KeyboardInterrupt

    monkeypatch.setattr(fold, "fold_checkpoint", interrupted)
    refused(fold_cli.main, [src, str(tmp_path / "out"), "--no-progress"], capsys, "interrupted", code=130)
    assert tree(tmp_path) == before


def test_full_disk_exits_2_with_one_line(tmp_path, capsys, monkeypatch):
    """The disk fills mid-export (ENOSPC from the weight writer; a Qwen3-1.7B export once ended in a traceback): one
    line naming it, exit 2, input untouched. (The transforms' own writers name it already: "could not write ...".)"""
    import errno

    from paddle_vha.cli import export_onnx as export_cli
    from paddle_vha.export import onnx_export

    src = save_vha(tmp_path / "in")
    before = tree(tmp_path)

    def disk_full(ckpt, out, **kw):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp_path / "out.tmp" / "model.onnx.data"))

    monkeypatch.setattr(onnx_export, "export_onnx", disk_full)
    refused(export_cli.main, [src, str(tmp_path / "out")], capsys, "out of disk space writing", code=2)
    assert tree(tmp_path) == before


SIGTERM_CHILD = r"""
import os, sys, time
from paddle_vha.checkpoint.fsutil import atomic_dir, scratch_dir
from paddle_vha.cli import command

@command
def main(argv=None):
    with scratch_dir("vha-logits-") as scratch, atomic_dir(sys.argv[1]) as tmp:
        open(os.path.join(tmp, "half.bin"), "wb").write(b"x" * 1000)
        print(scratch, tmp, flush=True)
        time.sleep(60)
    return 0

sys.exit(main())
"""


def test_sigterm_removes_temporaries_and_scratch(tmp_path):
    """SIGTERM mid-write (a job scheduler's kill): exit 143 with one line, the output's temporary and the scratch
    folder under the system temp folder removed, no OUT (both used to stay: 51 MB of /tmp/vha-* per killed run)."""
    env = dict(os.environ, TMPDIR=str(tmp_path / "tmp"), PYTHONPATH=ROOT)
    (tmp_path / "tmp").mkdir()
    child = subprocess.Popen([sys.executable, "-c", SIGTERM_CHILD, str(tmp_path / "out")], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    scratch, tmp = child.stdout.readline().split()
    assert os.path.isdir(scratch) and os.path.isdir(tmp)
    child.send_signal(signal.SIGTERM)
    _, err = child.communicate(timeout=60)
    print(err)
    assert child.returncode == 143 and err.strip().splitlines() == ["error: terminated (SIGTERM); temporaries removed"]
    assert not os.path.exists(scratch) and not os.path.exists(tmp) and not (tmp_path / "out").exists()
    assert os.listdir(tmp_path / "tmp") == []


def test_next_run_removes_scratch_of_a_killed_run_only(tmp_path, monkeypatch):
    """kill -9 cannot clean up: the next scratch_dir of the same prefix removes folders whose marker proves a dead
    writer of this host, and keeps a look-alike without one (a user's)."""
    import tempfile

    from paddle_vha.checkpoint.fsutil import scratch_dir

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale, mine = tmp_path / "vha-logits-killed", tmp_path / "vha-logits-notes"
    for d in (stale, mine):
        d.mkdir()
        (d / "data").write_bytes(b"\0" * 4096)
    (stale / MARKER).write_text(json.dumps({"tool": "verify", "pid": dead.pid, "host": socket.gethostname(),
                                            "start": None}))
    with scratch_dir("vha-logits-") as s:
        assert os.path.isfile(os.path.join(s, MARKER))
    assert not stale.exists() and (mine / "data").exists() and not os.path.exists(s)


def test_output_under_a_file_parent_is_one_line(tmp_path, capsys):
    """export / merge / fold with OUT under a parent that is a file: one line naming the output (export and merge
    raised OSError: [Errno 20])."""
    from paddle_vha.cli import export_onnx, fold, merge_tp_checkpoint

    (tmp_path / "afile").write_text("not a folder")
    cases = ((fold, save_vha(tmp_path / "vha"), []), (export_onnx, save_stock(tmp_path / "stock"), []),
             (merge_tp_checkpoint, fake_shards(tmp_path / "shards"), []))
    before = tree(tmp_path)
    for tool, src, argv in cases:
        refused(tool.main, [src, str(tmp_path / "afile" / "out"), *argv], capsys, "cannot create the output folder")
        assert tree(tmp_path) == before, tool.__name__


@pytest.mark.parametrize("how", ["inside", "link"])
def test_calib_data_inside_out_is_refused(tmp_path, capsys, how):
    """--calib-data FILE that lies in OUT (or is a link into it): --force would delete the text the run reads."""
    from paddle_vha.cli import compress_kv, convert_to_vha

    for n, (tool, argv) in enumerate(((compress_kv, ["--kv-heads", "1"]),
                                      (convert_to_vha, ["--kv-heads", "1", "--no-compare"]))):
        src, out = save_stock(tmp_path / f"stock{n}"), tmp_path / f"out{n}"
        out.mkdir()
        (out / MARKER).write_text(json.dumps({"tool": "compress_kv", "pid": os.getpid(), "host": socket.gethostname()}))
        (out / "calib.txt").write_text("some text to calibrate on " * 50)
        calib = out / "calib.txt"
        if how == "link":
            calib = tmp_path / f"calib{n}.txt"
            os.symlink(out / "calib.txt", calib)
        before = tree(tmp_path)
        refused(tool.main, [src, str(out), "--force", "--calib-data", str(calib), *argv], capsys, "--calib-data")
        assert tree(tmp_path) == before, tool.__name__
