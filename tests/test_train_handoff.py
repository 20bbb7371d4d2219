"""What tools/train.py hands on: a bfloat16 checkpoint uptrained on the CPU (fp32 compute, saved back in bfloat16) keeps
its tokenizer files, generation config, chat template and use_cache; data that does not fit the model is refused.

The starting checkpoint is a small Qwen3-VHA (hidden 48) with Qwen3's vocabulary (151,936) stored in bfloat16, with the
fixture's tokenizer files (tools/fixtures/qwen3_shaped.py: a trained byte-level BPE with Qwen3's special-token ids);
its training data is made by tools/make_pretrain_data.py with that tokenizer. References: the source's files byte for
byte, the source's config, ml_dtypes' round-to-nearest-even for the narrowing, the source folder's hashes (untouched).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import paddle
import pytest

from _utils import TINY, tiny_config
from hostile import ROOT, refused, tree

VOCAB = 151936
SIDE_FILES = ["chat_template.jinja", "generation_config.json", "special_tokens_map.json", "tokenizer.json",
              "tokenizer_config.json"]


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """(bf16 Qwen3-VHA checkpoint with the fixture's tokenizer files, pretraining data tokenized with it)."""
    from paddle_vha import Qwen3VHAForCausalLM
    from paddle_vha.cli.make_pretrain_data import main as make_data
    from tools.fixtures.qwen3_shaped import write_tokenizer

    root = tmp_path_factory.mktemp("handoff")
    ck = str(root / "vha-bf16")
    paddle.seed(5)
    Qwen3VHAForCausalLM(tiny_config(vocab_size=VOCAB, tie_word_embeddings=True)).to(dtype="bfloat16").save_pretrained(ck)
    for f in os.listdir(ck):
        if f.startswith("saved_signal_"):
            os.remove(os.path.join(ck, f))
    cfg_path = os.path.join(ck, "config.json")
    cfg = json.load(open(cfg_path))
    cfg["use_cache"] = True  # as a hub checkpoint says
    json.dump(cfg, open(cfg_path, "w"), indent=2)
    write_tokenizer(ck)
    data = str(root / "data" / "stdlib")
    assert make_data(["stdlib", "--tokenizer", ck, "--corpus-mb", "0.1", "--out", data, "--no-progress"]) == 0
    return ck, data


def _train(*args):
    r = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "train.py"), os.path.join(ROOT, "configs",
                                                                                               "tiny-vha.json"),
                        "--max_seq_len", "16", "--per_device_train_batch_size", "2", "--per_device_eval_batch_size", "2",
                        "--max_eval_samples", "2", "--logging_steps", "1", "--warmup_steps", "0", "--eval_steps", "2",
                        "--disable_tqdm", "true", *args], capture_output=True, text=True, cwd=ROOT, timeout=600)
    print(r.stdout[-2000:], r.stderr[-3000:])
    return r


def test_bf16_checkpoint_uptrains_on_cpu_and_keeps_what_a_runtime_needs(source, tmp_path):
    from paddle_vha.checkpoint.folder import CheckpointFolder
    from paddle_vha.checkpoint.safetensors_io import to_float32
    from paddle_vha.families import family

    ck, data = source
    before = tree(ck)
    out = str(tmp_path / "run")
    r = _train("--model_name_or_path", ck, "--dataset", "pretrain", "--input_dir", data, "--max_steps", "2",
               "--save_steps", "2", "--learning_rate", "1e-3", "--output_dir", out)
    assert r.returncode == 0
    assert tree(ck) == before  # the loader's flex-checkpoint metadata went elsewhere
    src = CheckpointFolder(ck)
    for model_dir in (os.path.join(out, "model"), os.path.join(out, "checkpoint-2", "model")):
        for f in SIDE_FILES:
            assert open(os.path.join(model_dir, f), "rb").read() == open(os.path.join(ck, f), "rb").read(), f
        cfg = json.load(open(os.path.join(model_dir, "config.json")))
        print(model_dir, {k: cfg.get(k) for k in ("use_cache", "dtype", "torch_dtype")})
        assert cfg["use_cache"] is True and cfg["dtype"] == "bfloat16"
        got = CheckpointFolder(model_dir)
        assert {ref.dtype for ref in got.tensors.values()} == {"BF16"}  # stored as the source was
        assert set(got.shapes) == set(src.shapes) and got.shapes == src.shapes
        family("qwen3_vha").validate(model_dir)
    moved = {n: float(np.abs(to_float32(got.read(n)) - to_float32(src.read(n))).max()) for n in src.tensors}
    print("max |trained - source| per tensor (max over tensors):", max(moved.values()))
    assert max(moved.values()) > 0 and max(moved.values()) < 0.1  # two small steps: trained, not replaced
    log = [json.loads(x) for x in open(os.path.join(out, "train_log.jsonl"))]
    assert all(np.isfinite(r["loss"]) for r in log if "loss" in r)


def test_narrowing_rounds_to_nearest_even(tmp_path):
    """The save's float32 -> bfloat16 step against ml_dtypes' cast (round to nearest even), file and index rewritten."""
    import ml_dtypes

    from paddle_vha.checkpoint import safetensors_io as st
    from paddle_vha.checkpoint.folder import CheckpointFolder
    from paddle_vha.train.saving import _narrow_weights

    rng = np.random.default_rng(0)
    tensors = {"a": rng.standard_normal((300, 7)).astype(np.float32) * 3, "b": np.arange(5, dtype=np.float32) + 1 / 3,
               "c": rng.standard_normal((4,)).astype(np.float32)}
    specs = [(n, "F32", a.shape) for n, a in tensors.items()]
    w = st.ShardWriter(str(tmp_path / "model-00001-of-00001.safetensors"), specs)
    for n, a in tensors.items():
        w.write(n, a)
    w.close()
    st.write_index(str(tmp_path / "model.safetensors.index.json"), {n: "model-00001-of-00001.safetensors"
                                                                    for n in tensors}, 4 * sum(a.size for a in tensors.values()))
    json.dump({}, open(tmp_path / "config.json", "w"))
    _narrow_weights(str(tmp_path), "BF16")
    got = CheckpointFolder(str(tmp_path))
    for n, a in tensors.items():
        assert got.tensors[n].dtype == "BF16"
        assert np.array_equal(got.read(n).view(np.uint16), a.astype(ml_dtypes.bfloat16).view(np.uint16)), n
    index = json.load(open(tmp_path / "model.safetensors.index.json"))
    assert index["metadata"]["total_size"] == 2 * sum(a.size for a in tensors.values())


def test_data_that_does_not_fit_the_model_is_refused(source, tmp_path, capsys, monkeypatch):
    """Byte data (the stdlib corpus, or --bytes data) for a model with a tokenizer and 151,936 ids, and ids beyond a
    model's vocabulary: one line, before anything is built, nothing written."""
    from paddle_vha.cli import train
    from paddle_vha.cli.make_pretrain_data import main as make_data

    ck, data = source
    byte_data = str(tmp_path / "bytes" / "stdlib")
    assert make_data(["stdlib", "--bytes", "--corpus-mb", "0.05", "--out", byte_data, "--no-progress"]) == 0
    capsys.readouterr()
    monkeypatch.chdir(tmp_path)
    cfg = os.path.join(ROOT, "configs", "tiny-vha.json")
    before = tree(tmp_path)
    base = [cfg, "--output_dir", str(tmp_path / "out"), "--max_steps", "2"]
    line = refused(train.main, base + ["--model_name_or_path", ck], capsys, "dataset=stdlib (the embedded corpus) is "
                   "byte-level")
    assert f"--tokenizer {ck}" in line
    refused(train.main, base + ["--model_name_or_path", ck, "--dataset", "pretrain", "--input_dir", byte_data], capsys,
            "every id read is < 256")
    small = json.dumps(dict(TINY, vocab_size=1000))
    refused(train.main, base + ["--model_config", small, "--dataset", "pretrain", "--input_dir", data], capsys,
            ">= the model's vocab_size 1,000")
    assert tree(tmp_path) == before


def test_a_sample_beyond_the_vocabulary_stops_in_one_line():
    """What the scan of a large file may not have read: the dataset refuses the sample (the trainer turns it into one
    line)."""
    from paddle_vha.train.data_checks import IdRangeError
    from paddle_vha.train.datasets import ShiftedTokens
    from paddle_vha.train.fit import _training_failure

    ds = ShiftedTokens([{"text": np.array([1, 2, 3])}, {"text": np.array([4, 99, 5])}], vocab_size=50)
    assert ds[0]["labels"].tolist() == [2, 3]
    with pytest.raises(IdRangeError, match="sample 1 holds token id 99 >= the model's vocab_size 50") as e:
        ds[1]
    assert "nothing saved" in _training_failure(e.value, 3, 3, None)
