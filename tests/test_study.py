"""The VHA-vs-GQA study (tools/study.py, the experiment in tools/experiments/study.py), run small: it trains every
requested variant and seed, writes JSON + PNG."""
import json
import os
import subprocess
import sys
import types

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_study_smoke(tmp_path):
    res = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "study.py"), "--seeds", "0", "1", "--steps", "6",
                          "--eval-every", "3", "--val-batches", "2", "--batch-size", "4", "--corpus-mb", "1",
                          "--variants", "GQA-8", "GQA-2 half-q", "VHA", "--out", str(tmp_path), "--no-progress"],
                         capture_output=True, text=True, timeout=600, cwd=ROOT)
    print(res.stdout)
    assert res.returncode == 0, res.stderr[-3000:]
    data = json.load(open(tmp_path / "study.json"))
    assert len(data["runs"]) == 6 and {r["variant"] for r in data["runs"]} == {"GQA-8", "GQA-2 half-q", "VHA"}
    for r in data["runs"]:
        assert [s for s, _ in r["val_curve"]] == [3, 6] and all(np.isfinite(v) for _, v in r["val_curve"])
    vha = data["stats"]["VHA"]
    assert vha["n"] == 2 and abs(vha["mean"] - np.mean(vha["per_seed"])) < 1e-12
    assert open(tmp_path / "study.png", "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    assert "within noise" in res.stdout or "beyond noise" in res.stdout


def test_ablations_freeze_the_right_map():
    from tools.experiments import study
    from paddle_vha.train.corpus import load_stdlib_corpus
    from paddle_vha.train.loop import TrainSettings, train_lm

    args = types.SimpleNamespace(hidden=32, layers=1, head_dim=8, seq_len=16, rank=2)
    corpus = load_stdlib_corpus(max_bytes=1 << 20)
    s = TrainSettings(steps=3, batch_size=2, seq_len=16, val_batches=1, progress=False)

    post_only = study.build("VHA postmix-only", args, seed=0)
    train_lm(post_only, corpus, s)
    attn = post_only.model.layers[0].self_attn
    eye = np.broadcast_to(np.eye(8), attn.vha_premix_weight.shape)
    assert np.array_equal(attn.vha_premix_weight.numpy(), eye)  # frozen at the identity
    assert np.abs(attn.vha_postmix_V.numpy()).max() > 0  # Postmix trained

    pre_only = study.build("VHA premix-only", args, seed=0)
    before = pre_only.model.layers[0].self_attn.vha_premix_weight.numpy().copy()
    train_lm(pre_only, corpus, s)
    attn = pre_only.model.layers[0].self_attn
    assert not np.abs(attn.vha_postmix_U.numpy()).any() and not np.abs(attn.vha_postmix_V.numpy()).any()
    assert not np.array_equal(attn.vha_premix_weight.numpy(), before)  # Premix trained
