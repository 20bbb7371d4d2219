"""Hostile but realistic input, train on bad arguments, a non-finite loss and a truncated checkpoint. Each case asserts
the exit code, one line on stderr naming the problem, nothing written, and the inputs byte-identical (helpers:
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


TRAIN_CASES = {
    "nan-learning-rate": (["--learning_rate", "nan"], "learning_rate must be a finite number"),
    "negative-max-steps": (["--max_steps", "-5"], "max_steps must be > 0, or -1"),
    "zero-batch": (["--per_device_train_batch_size", "0"], "per_device_train_batch_size must be >= 1"),
    "output-is-a-file": (["--output_dir", "FILE"], "exists and is not a folder"),
    "output-is-the-input": (["--model_name_or_path", "VHA", "--output_dir", "VHA"], "must be a different folder"),
    "output-is-cwd": (["--output_dir", "."], "current folder"),
    "foreign-model-dir": (["--output_dir", "RUN"], "was not written by paddle-vha"),
    "seed-negative": (["--seed", "-1"], "seed must be in [0, 2**32), got -1"),
    "seed-huge": (["--seed", str(2**70)], f"seed must be in [0, 2**32), got {2**70}"),
    "epochs-nan": (["--max_steps", "-1", "--num_train_epochs", "nan"], "num_train_epochs must be a finite number > 0"),
    "model-config-device": (["--model_config", "/dev/zero"], "/dev/zero: a device"),  # was read until killed (OOM)
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


def test_second_run_into_one_output_dir_is_refused(tmp_path, capsys, monkeypatch):
    """While a run holds output_dir (its lock), another run into it is refused in one line and writes nothing there
    (two runs both exited 0 with one interleaved train_log.jsonl); the lock dies with its holder."""
    import fcntl

    from paddle_vha.cli import train
    from paddle_vha.train.run_lock import LOCK_FILE

    out = tmp_path / "out"
    out.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, sys, time; f = open(sys.argv[1], 'a+'); "
                               "fcntl.flock(f, fcntl.LOCK_EX); "
                               "print('held', flush=True); time.sleep(120)", str(out / LOCK_FILE)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        monkeypatch.chdir(tmp_path)
        before = tree(tmp_path)
        argv = [os.path.join(ROOT, "configs", "tiny-vha.json"), "--output_dir", str(out), "--max_steps", "1"]
        refused(train.main, argv, capsys, "another training run is writing it")
        assert tree(tmp_path) == before
    finally:
        holder.kill()
        holder.wait()
    with open(out / LOCK_FILE, "a+") as f:  # the holder is gone: the lock is free again
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)


def test_train_refuses_up_front_when_memory_is_short(tmp_path, capsys, monkeypatch):
    """A run the machine cannot hold is refused in one line before anything is built or written, naming its need; the
    need counts 32 bytes per weight (float32 weights, gradients, AdamW moments, the save's copies), weights counted here
    from the widths (Qwen3-0.6B's, 28 layers, tied: 596 M), plus the logits."""
    from paddle_vha.cli import train
    from paddle_vha.train import memory

    fields = dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                  num_attention_heads=16, num_key_value_heads=8, head_dim=128, tie_word_embeddings=True,
                  max_position_embeddings=256, rms_norm_eps=1e-6, rope_theta=1e6)
    h, d, inter, v = 1024, 128, 3072, 151936
    per_layer = h * 16 * d * 2 + h * 8 * d * 2 + 3 * h * inter + 2 * h + 2 * d
    weights = v * h + 28 * per_layer + h
    print(f"Qwen3-0.6B widths: {weights / 1e6:.1f} M weights")
    monkeypatch.setattr(memory, "available_memory_bytes", lambda: 4 << 30)
    monkeypatch.chdir(tmp_path)
    before = tree(tmp_path)
    argv = [os.path.join(ROOT, "configs", "tiny-qwen3.json"), "--model_config", json.dumps(fields), "--output_dir",
            "out", "--max_steps", "1", "--max_seq_len", "128", "--per_device_train_batch_size", "1",
            "--per_device_eval_batch_size", "1"]
    err = refused(train.main, argv, capsys, "refusing to train")
    need_gb = float(err.split("needs about ")[1].split(" GB")[0])
    expect_gb = (32 * weights + 16 * 128 * v + (800 << 20)) / 2**30
    print(f"stated need {need_gb} GB, expected about {expect_gb:.2f} GB")
    assert abs(need_gb - expect_gb) / expect_gb < 0.05 and "MemAvailable is 4 GB" in err
    assert tree(tmp_path) == before


def test_a_full_disk_during_a_save_stops_in_one_line_and_leaves_no_half_checkpoint(tmp_path):
    """The Trainer's save hitting ENOSPC (what a full disk raises; the real OSError, from writing to /dev/full) ends in
    one TrainError line naming it; the half-written checkpoint-N (no trainer_state.json) is removed so a resume cannot
    pick it, and the complete checkpoint before it is kept."""
    import errno
    from types import SimpleNamespace

    from paddle_vha.train.errors import TrainError
    from paddle_vha.train.fit import train_model

    out = tmp_path / "run"
    (out / "checkpoint-1").mkdir(parents=True)
    (out / "checkpoint-1" / "trainer_state.json").write_text("{}")

    class SavingTrainer:  # stands in for trainer.train: writes checkpoint-2's first file onto a full disk
        args = SimpleNamespace(output_dir=str(out))
        state = SimpleNamespace(global_step=2)

        def train(self, resume_from_checkpoint=None):
            (out / "checkpoint-2" / "model_state").mkdir(parents=True)
            (out / "checkpoint-2" / "model_state" / "part.distcp").write_bytes(b"partial")
            with open("/dev/full", "wb", buffering=0) as f:
                f.write(b"x" * 4096)

    with pytest.raises(TrainError) as e:
        train_model(SavingTrainer(), log=None, model=None, resume=None)
    print(e.value)
    assert isinstance(e.value.__cause__, OSError) and e.value.__cause__.errno == errno.ENOSPC
    assert "no space left on the device" in str(e.value) and "\n" not in str(e.value)
    assert not (out / "checkpoint-2").exists() and (out / "checkpoint-1" / "trainer_state.json").is_file()


def test_train_refuses_a_garbage_index_in_one_line(tmp_path):
    """dataset=pretrain with a PREFIX.idx that is not an index: one line, and no ignored-exception traceback from
    PaddleFormers' Index.__del__ after it (the run printed one). Run as a process: the traceback went to stderr
    at interpreter level."""
    (tmp_path / "d.bin").write_bytes(b"\0" * 4096)
    (tmp_path / "d.idx").write_bytes(bytes(range(200)))
    before = tree(tmp_path)
    res = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "train.py"),
                          os.path.join(ROOT, "configs", "tiny-vha.json"), "--output_dir", str(tmp_path / "run"),
                          "--max_steps", "1", "--dataset", "pretrain", "--input_dir", str(tmp_path / "d")],
                         capture_output=True, text=True, timeout=300)
    print(res.stderr[-1500:])
    errors = [ln for ln in res.stderr.splitlines() if ln.startswith("error:")]
    assert res.returncode == 2 and len(errors) == 1 and "d.idx: not PaddleFormers mmap pretraining data" in errors[0]
    assert "Traceback" not in res.stderr
    assert tree(tmp_path) == before


@pytest.mark.parametrize("damage", ["string-offsets", "truncated"])
def test_train_from_a_broken_checkpoint_names_it(tmp_path, capsys, monkeypatch, damage):
    """model_name_or_path whose shard header holds string offsets, or whose shard is cut short: one line naming the
    user's file (an uncaught CheckpointError naming the loader's temporary view before), the input untouched."""
    from paddle_vha.cli import train

    src = save_vha(tmp_path / "VHA", vocab_size=256)
    shard = next(os.path.join(src, f) for f in os.listdir(src) if f.endswith(".safetensors"))
    if damage == "truncated":
        os.truncate(shard, os.path.getsize(shard) - 100)
    else:
        raw = open(shard, "rb").read()
        n = int.from_bytes(raw[:8], "little")
        header = json.loads(raw[8:8 + n])
        name = next(k for k in header if k != "__metadata__")
        header[name]["data_offsets"] = [str(v) for v in header[name]["data_offsets"]]
        text = json.dumps(header).encode()
        open(shard, "wb").write(len(text).to_bytes(8, "little") + text + raw[8 + n:])
    monkeypatch.chdir(tmp_path)
    before = tree(tmp_path)
    argv = [os.path.join(ROOT, "configs", "tiny-vha.json"), "--model_name_or_path", src, "--output_dir", "out",
            "--max_steps", "1"]
    line = refused(train.main, argv, capsys, shard)
    assert "paddle-vha-train-" not in line and tree(tmp_path) == before


def test_a_layer_count_bomb_is_refused_before_the_config_is_built(tmp_path, capsys, monkeypatch):
    """model_config num_hidden_layers 1e8 (no layer_types): refused in one line from the fields as written, before
    PaddleFormers' Qwen3Config builds its 1e8-element per-layer lists (which ran past 200 s before); nothing written."""
    import time

    from paddle_vha.cli import train

    monkeypatch.chdir(tmp_path)
    before = tree(tmp_path)
    argv = [os.path.join(ROOT, "configs", "tiny-vha.json"), "--model_config",
            json.dumps(dict(TINY, vocab_size=256, num_hidden_layers=10 ** 8)), "--output_dir", "out", "--max_steps", "1"]
    t0 = time.time()
    err = refused(train.main, argv, capsys, "refusing to train")
    print(f"{time.time() - t0:.1f} s: {err}")
    assert "num_hidden_layers 100,000,000" in err and time.time() - t0 < 60
    assert tree(tmp_path) == before


# ---- tools/make_pretrain_data.py --------------------------------------------------------------------------------

@pytest.mark.parametrize("argv,needle", [(["--corpus-mb", "nan"], "--corpus-mb nan: must be a finite number > 0"),
                                         (["--corpus-mb", "inf"], "--corpus-mb inf: must be a finite number > 0")])
def test_pretrain_data_refuses_a_corpus_size_that_is_not_a_number(tmp_path, capsys, argv, needle):
    """--corpus-mb nan passed "> 0", then int(nan) raised a traceback after the output folder was made."""
    from paddle_vha.cli import make_pretrain_data

    before = tree(tmp_path)
    with pytest.raises(SystemExit) as e:
        make_pretrain_data.main(["stdlib", "--bytes", "--out", str(tmp_path / "data" / "x"), *argv])
    last = capsys.readouterr().err.strip().splitlines()[-1]
    print(last)
    assert e.value.code == 2 and needle in last and tree(tmp_path) == before


def test_pretrain_data_creates_nothing_for_inputs_it_refuses(tmp_path, capsys):
    """A .jsonl refused at its second line, a .txt that is not UTF-8: one line each, and PREFIX's folder, which did
    not exist, still does not (it was created before the inputs were read)."""
    from paddle_vha.cli import make_pretrain_data

    (tmp_path / "bad.jsonl").write_text('{"text": "ok"}\n{"body": "no text field"}\n')
    (tmp_path / "latin1.txt").write_bytes("caf\u00e9 au lait\n".encode("latin-1"))
    (tmp_path / "notutf8.jsonl").write_bytes(b'{"text": "ok"}\n{"text": "caf\xe9"}\n')
    before = tree(tmp_path)
    out = str(tmp_path / "new" / "corpus")
    refused(make_pretrain_data.main, [str(tmp_path / "bad.jsonl"), "--bytes", "--out", out, "--no-progress"], capsys,
            "bad.jsonl:2: not a JSON object with a 'text' string field")
    refused(make_pretrain_data.main, [str(tmp_path / "latin1.txt"), "--bytes", "--out", out, "--no-progress"], capsys,
            "latin1.txt: not valid UTF-8 at byte 3 (0xe9)")
    refused(make_pretrain_data.main, [str(tmp_path / "notutf8.jsonl"), "--bytes", "--out", out], capsys,
            "notutf8.jsonl:2: not valid UTF-8 at byte 13 (0xe9)")
    assert tree(tmp_path) == before and not (tmp_path / "new").exists()


def test_pretrain_data_bytes_are_the_documents_bytes(tmp_path, capsys):
    """--bytes stores each document's UTF-8 bytes exactly, then a NUL (text that is not UTF-8 is refused above, not
    turned into U+FFFD as it was); the output folder appears with the data."""
    from paddle_vha.cli import make_pretrain_data

    docs = ["h\u00e9llo \u2713 caf\u00e9\n", "\U0001f600 x = 1\n"]
    for k, d in enumerate(docs):
        (tmp_path / f"d{k}.txt").write_text(d, encoding="utf-8")
    (tmp_path / "more.jsonl").write_text(json.dumps({"text": docs[1]}) + "\n")
    out = tmp_path / "data" / "c"
    assert make_pretrain_data.main([str(tmp_path / "d0.txt"), str(tmp_path / "d1.txt"), str(tmp_path / "more.jsonl"),
                                    "--bytes", "--out", str(out), "--no-progress"]) == 0
    got = np.fromfile(str(out) + ".bin", dtype=np.uint16)
    want = np.concatenate([np.frombuffer(d.encode("utf-8") + b"\0", np.uint8) for d in docs + docs[1:]])
    print(f"{got.size} tokens stored, {want.size} bytes expected")
    assert np.array_equal(got, want.astype(np.uint16))
    assert sorted(os.listdir(tmp_path / "data")) == ["c.bin", "c.idx"]  # no temporaries left


@pytest.mark.parametrize("out", ["data/", "data"])
def test_pretrain_data_out_must_name_files_not_a_folder(tmp_path, capsys, monkeypatch, out):
    """--out data/ (or an existing folder) wrote hidden data/.bin and data/.idx."""
    from paddle_vha.cli import make_pretrain_data

    monkeypatch.chdir(tmp_path)
    (tmp_path / "a.txt").write_text("text")
    (tmp_path / "data").mkdir()
    before = tree(tmp_path)
    with pytest.raises(SystemExit) as e:
        make_pretrain_data.main(["a.txt", "--bytes", "--out", out])
    last = capsys.readouterr().err.strip().splitlines()[-1]
    print(last)
    assert e.value.code == 2 and f"--out {out}: names a folder" in last and tree(tmp_path) == before


# ---- options that cannot take effect, and parallel degrees without the processes (tools/train.py) ----------------

INERT_TRAIN = {
    "pipeline-without-launcher": (["--pipeline_model_parallel_size", "2"],
                                  "pipeline_model_parallel_size=2 needs at least 2 processes, this run has 1"),
    "sharding-without-launcher": (["--sharding_parallel_size", "2"], "sharding_parallel_size=2 needs at least 2"),
    "kl-without-teacher": (["--distill_kl_weight", "0.5"],
                           "distill_kl_weight has no effect in this run: it takes effect with a teacher"),
    "attn-without-teacher": (["--distill_attn_weight", "0.5"], "distill_attn_weight has no effect in this run"),
    "temperature-without-teacher": (["--distill_temperature", "2"], "distill_temperature has no effect in this run"),
    "epochs-with-max-steps": (["--num_train_epochs", "3"], "num_train_epochs has no effect in this run"),
    "polynomial-power-with-cosine": (["--power", "2"], "power has no effect in this run: it takes effect with "
                                                       "lr_scheduler_type polynomial"),
    "amp-level-without-amp": (["--fp16_opt_level", "O2"], "fp16_opt_level has no effect in this run"),
    "input-dir-with-stdlib": (["--input_dir", "data/x"], "input_dir has no effect in this run: it takes effect with "
                                                         "dataset=pretrain"),
    "shape-as-training-argument": (["--hidden_size", "32"], "hidden_size has no effect in tools/train.py"),
    "shuffle-overridden": (["--dataloader_shuffle", "true"], "dataloader_shuffle has no effect in tools/train.py"),
    "eval-off-turned-on": (["--do_eval", "false", "--evaluation_strategy", "steps"], "do_eval false has no effect"),
    # not inert but the same cause as make_pretrain_data's --corpus-mb nan: NaN passes every comparison
    "corpus-mb-nan": (["--corpus_mb", "nan"], "corpus_mb must be a finite number, got nan"),
    "weight-decay-inf": (["--weight_decay", "inf"], "weight_decay must be a finite number, got inf"),
}


@pytest.mark.parametrize("case", list(INERT_TRAIN))
def test_train_refuses_what_cannot_take_effect(tmp_path, capsys, monkeypatch, case):
    """Each was accepted and ignored (a pipeline degree without the launcher trained the plain model, exit 0):
    refused in one line before anything is built or created."""
    from paddle_vha.cli import train

    monkeypatch.chdir(tmp_path)
    extra, needle = INERT_TRAIN[case]
    before = tree(tmp_path)
    argv = [os.path.join(ROOT, "configs", "tiny-vha.json"), "--output_dir", "out", "--max_steps", "2", *extra]
    refused(train.main, argv, capsys, needle)
    assert tree(tmp_path) == before


def test_a_config_part_switched_off_on_the_command_line_is_not_refused(tmp_path, capsys, monkeypatch):
    """The config's eval_steps / per_device_eval_batch_size with --do_eval false on the command line: the user's
    choice, not an ignored option (and do_eval false now turns evaluation off; PaddleFormers turned it back on for the
    config's evaluation_strategy steps). A config's own inert option is refused, naming the config."""
    from paddle_vha.cli import train

    monkeypatch.chdir(tmp_path)
    cfg = os.path.join(ROOT, "configs", "tiny-vha.json")
    assert train.main([cfg, "--output_dir", "out", "--max_steps", "2", "--do_eval", "false", "--dry_run", "true"]) == 0
    bad = dict(json.load(open(cfg)), distill_temperature=2.0)
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    refused(train.main, [str(tmp_path / "bad.json"), "--output_dir", "out", "--dry_run", "true"], capsys,
            "distill_temperature (set in")


@pytest.mark.parametrize("config", sorted(f for f in os.listdir(os.path.join(ROOT, "configs")) if f.endswith(".json")))
def test_every_shipped_config_passes_the_option_checks(config):
    """The shipped configs are consistent: every argument they set takes effect in the run they describe."""
    from paddle_vha.train.arguments import parse

    parsed = parse([os.path.join(ROOT, "configs", config), "--dry_run", "true"])
    assert parsed[2].dry_run
