"""Hostile but realistic input to every tool that reads or writes (issue 17): each case asserts the exit code, one line
on stderr naming the problem, nothing written, and the inputs byte-identical.

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


# --- fold ------------------------------------------------------------------------------------------------------------

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


def fake_shards(path):
    """A tensor-parallel sharded save of a tiny Qwen3-VHA model, as save_tp_checkpoint writes it (t = 2)."""
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
    files = [f"tp-rank-{k:02d}-of-02.safetensors" for k in range(2)]
    for f, part in zip(files, parts):
        w = st.ShardWriter(os.path.join(path, f), [(n, "F32", a.shape) for n, a in part.items()])
        for n, a in part.items():
            w.write(n, a)
        w.close()
    with open(os.path.join(path, PLAN_FILE), "w") as fh:
        json.dump({"format": FORMAT, "tensor_parallel_size": 2, "files": files, "tensors": tensors}, fh)
    return str(path)


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
    (stale / MARKER).write_text(json.dumps({"tool": "fold", "pid": child.pid, "start": None}))
    live = tmp_path / ".out.tmp-live"  # a run still writing: left alone
    live.mkdir()
    (live / MARKER).write_text(json.dumps({"tool": "fold", "pid": os.getpid(), "start": None}))
    child.send_signal(signal.SIGKILL)
    child.wait()
    assert main([src, str(tmp_path / "out"), "--no-progress"]) == 0
    err = capsys.readouterr().err
    print(err)
    assert not stale.exists() and live.exists()
    assert [ln for ln in err.splitlines() if "interrupted earlier run" in ln] == [
        f"note: removed {stale}, left by an interrupted earlier run (its process is gone)"]


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


# --- compress_kv -----------------------------------------------------------------------------------------------------

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


# --- export_onnx -----------------------------------------------------------------------------------------------------

EXPORT_CASES = {
    "nan-embedding-row": (lambda p: _rewrite_tensors(p, set_tensor("model.embed_tokens.weight", nan_at)), [],
                          "model.embed_tokens.weight holds 1 non-finite value(s)"),
    "opset-22": (lambda p: None, ["--opset", "22"], "converts to opsets 14..21"),
    "nan-eps": (lambda p: edit_config(p, rms_norm_eps=float("nan")), [], "rms_norm_eps"),
    "window-without-size": (lambda p: edit_config(p, sliding_window=None, use_sliding_window=False,
                                                  layer_types=["full_attention", "sliding_attention"]), [],
                            "layer_types names sliding_attention layers but sliding_window is None"),
    "vha": (lambda p: edit_config(p, model_type="qwen3_vha"), [], "fold it first"),
}


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
        _run_paddle2onnx(str(tmp_path / "model.json"), str(tmp_path / "model.pdiparams"), str(tmp_path / "m.onnx"), 17, "")
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


# --- generate --------------------------------------------------------------------------------------------------------

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
}


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


def test_generate_warns_past_max_position_embeddings(capsys, export_dir):
    from paddle_vha.cli.generate import main

    assert main([export_dir, "--prompt-ids", "1,2,3", "--max-new-tokens", "40"]) == 0
    err = capsys.readouterr().err
    warnings = [ln for ln in err.splitlines() if ln.startswith("warning:")]
    assert warnings == ["warning: prompt (3 tokens) + 40 new tokens pass max_position_embeddings=32; the model was not "
                        "trained on positions beyond it"]


def test_generation_stops_on_non_finite_logits():
    from paddle_vha.serve.generate import generate
    from paddle_vha.serve.session import ServeError

    class NaNSession:
        def prefill(self, ids, mask):
            return np.full((ids.shape[0], ids.shape[1], 7), np.nan, np.float32), None

    with pytest.raises(ServeError, match="not finite .* at generation step 1"):
        generate(NaNSession(), np.ones((1, 3), np.int64), 4)


# --- train -----------------------------------------------------------------------------------------------------------

TRAIN_CASES = {
    "nan-learning-rate": (["--learning_rate", "nan"], "learning_rate must be a finite number"),
    "negative-max-steps": (["--max_steps", "-5"], "max_steps must be > 0, or -1"),
    "zero-batch": (["--per_device_train_batch_size", "0"], "per_device_train_batch_size must be >= 1"),
    "output-is-a-file": (["--output_dir", "FILE"], "exists and is not a folder"),
    "output-is-the-input": (["--model_name_or_path", "VHA", "--output_dir", "VHA"], "must be a different folder"),
    "output-is-cwd": (["--output_dir", "."], "current folder"),
    "foreign-model-dir": (["--output_dir", "RUN"], "was not written by paddle-vha"),
    "layers-float": (["--model_config", json.dumps(dict(TINY, vocab_size=256, num_hidden_layers=2.0))],
                     "num_hidden_layers must be a positive int, got 2.0"),
}


@pytest.mark.parametrize("case", list(TRAIN_CASES))
def test_train_refuses_bad_arguments(tmp_path, capsys, monkeypatch, case):
    from paddle_vha.cli import train

    (tmp_path / "FILE").write_text("x")
    save_vha(tmp_path / "VHA")
    (tmp_path / "RUN" / "model").mkdir(parents=True)
    (tmp_path / "RUN" / "model" / "mine.txt").write_text("a model of the user's")
    monkeypatch.chdir(tmp_path)
    extra, needle = TRAIN_CASES[case]
    before = tree(tmp_path)
    argv = [os.path.join(ROOT, "configs", "tiny-vha.json"), "--output_dir", "out", "--max_steps", "2", *extra]
    refused(train.main, argv, capsys, needle)
    assert tree(tmp_path) == before


@pytest.mark.slow
def test_train_stops_on_a_non_finite_loss(tmp_path):
    """A learning rate that blows the weights up: the run stops with one line at the first non-finite loss, saves no
    model, and train_log.jsonl stays strict JSON."""
    out = tmp_path / "run"
    r = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "train.py"), "configs/tiny-vha.json",
                        "--output_dir", str(out), "--max_steps", "8", "--learning_rate", "1e12", "--logging_steps", "1",
                        "--warmup_steps", "0", "--max_grad_norm", "0", "--save_steps", "100", "--do_eval", "false"],
                       capture_output=True, text=True, cwd=ROOT, timeout=600)
    err = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    print(r.stdout[-1500:], r.stderr[-1500:])
    assert r.returncode == 2 and len(err) == 1 and "training stopped" in err[0] and "nothing saved" in err[0], err
    assert not (out / "model").exists()
    for line in (out / "train_log.jsonl").read_text().splitlines():
        json.loads(line, parse_constant=lambda c: pytest.fail(f"non-strict JSON constant {c} in train_log.jsonl"))


@pytest.mark.slow
def test_train_resume_from_a_truncated_checkpoint_says_why(tmp_path):
    """A checkpoint-N the Trainer cannot read: one line naming it and what to do; the run folder is left as it was."""
    import glob

    out = tmp_path / "run"
    cmd = [sys.executable, os.path.join(ROOT, "tools", "train.py"), "configs/tiny-vha.json", "--output_dir", str(out),
           "--save_steps", "2", "--do_eval", "false"]
    r = subprocess.run(cmd + ["--max_steps", "2"], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert os.path.isfile(out / "model" / MARKER)
    (state,) = glob.glob(str(out / "checkpoint-2" / "model_state" / "*.distcp"))
    with open(state, "r+b") as f:
        f.truncate(100)
    before = tree(tmp_path)
    r = subprocess.run(cmd + ["--max_steps", "4"], capture_output=True, text=True, cwd=ROOT, timeout=600)
    err = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    print(r.stderr[-1500:])
    assert r.returncode == 2 and len(err) == 1, r.stderr[-2000:]
    assert f"resuming from {out / 'checkpoint-2'} failed" in err[0] and "remove that checkpoint folder" in err[0]
    assert tree(tmp_path) == before
