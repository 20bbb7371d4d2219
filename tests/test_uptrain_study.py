"""tools/uptrain_study.py (tools/experiments/uptrain_study.py), run small: every start with both losses (CE and KD
against the base) and every reference, strict JSON, the crossover and curve tables, and the cached base."""
import json
import math
import os
import subprocess
import sys

import pytest
from strict_json import strict_json

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_uptrain_study_runs_small_and_caches_its_base(tmp_path):
    cmd = [sys.executable, os.path.join(ROOT, "tools", "uptrain_study.py"), "--seeds", "0", "1", "--base-steps", "12",
           "--uptrain-steps", "4", "--evals", "2", "--scratch-evals", "3", "--val-batches", "1", "--batch-size", "4",
           "--hidden", "32", "--calib-tokens", "256", "--study-refine-steps", "3", "--study-refine-tokens", "256",
           "--corpus-mb", "1", "--cache", str(tmp_path / "cache"), "--out", str(tmp_path),
           "--no-progress"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=ROOT)
    print(r.stdout[-4000:])
    assert r.returncode == 0, r.stderr[-3000:]
    data = strict_json(tmp_path / "uptrain.json")
    starts = {"GQA-2 mean-pool", "MEA", "VHA svd", "VHA calibrated", "VHA refined", "VHA regrouped", "VHA premix-off"}
    refs = {"GQA-2 scratch", "VHA scratch"}
    assert {x["start"] for x in data["runs"]} == starts | refs and len(data["runs"]) == 2 * (2 * 7 + 2)
    for x in data["runs"]:
        assert math.isfinite(x["val"]) and x["kl"] >= 0
        if "scratch" in x["start"]:
            assert x["val0"] is None and x["steps"] == 12 and x["loss"] == "ce"  # the base's tokens, CE
        else:
            assert x["kl0"] > 0 and x["steps"] == 4  # a start with a quarter of the cache is not the base
    by = lambda loss: [x for x in data["runs"] if x["loss"] == loss and x["start"] in starts]  # noqa: E731
    assert sorted((x["start"], x["seed"]) for x in by("ce")) == sorted((x["start"], x["seed"]) for x in by("kd"))
    for ce in by("ce"):  # the same converted start, the same batches: the arms differ from the first step
        kd = next(x for x in by("kd") if (x["start"], x["seed"]) == (ce["start"], ce["seed"]))
        assert kd["val0"] == ce["val0"] and kd["val"] != ce["val"]
    kl = {loss: sum(x["kl"] for x in by(loss)) / len(by(loss)) for loss in ("ce", "kd")}
    print(f"mean KL to the base after uptraining: CE {kl['ce']:.4f}, KD {kl['kd']:.4f}")
    assert kl["kd"] < kl["ce"]  # distilling from the base pulls the starts towards it
    assert set(data["crossover"]) == {f"{s} ({l})" for s in starts for l in ("CE", "KD")} | refs
    assert all(len(c["per_seed"]) == 2 for c in data["crossover"].values())
    md = open(tmp_path / "uptrain.md").read()
    assert "### Crossover" in md and "### The curve" in md and "VHA refined (KD)" in md
    assert "recovers most" in data["sentence"] and open(tmp_path / "uptrain.png", "rb").read(4) == b"\x89PNG"
    r2 = subprocess.run(cmd + ["--starts", "VHA svd", "--seeds", "0", "--losses", "ce"], capture_output=True, text=True, timeout=900,
                        cwd=ROOT)
    assert r2.returncode == 0, r2.stderr[-3000:]
    assert "base: cached" in r2.stderr
