"""tools/uptrain_study.py (tools/experiments/uptrain_study.py), run small: every start and reference, strict JSON,
and the cached base."""
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
           "--uptrain-steps", "4", "--evals", "2", "--val-batches", "1", "--batch-size", "4", "--hidden", "32",
           "--calib-tokens", "256", "--corpus-mb", "1", "--cache", str(tmp_path / "cache"), "--out", str(tmp_path),
           "--no-progress"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=ROOT)
    print(r.stdout[-4000:])
    assert r.returncode == 0, r.stderr[-3000:]
    data = strict_json(tmp_path / "uptrain.json")
    starts = {"GQA-2 mean-pool", "MEA", "VHA mean", "VHA svd", "VHA calibrated", "VHA premix-off", "GQA-2 scratch",
              "VHA scratch"}
    assert {x["start"] for x in data["runs"]} == starts and len(data["runs"]) == 16
    for x in data["runs"]:
        assert math.isfinite(x["val"]) and x["kl"] >= 0
        if "scratch" in x["start"]:
            assert x["val0"] is None and x["steps"] == 12  # the base's tokens (--reference-tokens base)
        else:
            assert x["kl0"] > 0 and x["steps"] == 4  # a start with a quarter of the cache is not the base
    assert "recovers most" in data["sentence"] and open(tmp_path / "uptrain.png", "rb").read(4) == b"\x89PNG"
    r2 = subprocess.run(cmd + ["--starts", "VHA svd", "--seeds", "0"], capture_output=True, text=True, timeout=900,
                        cwd=ROOT)
    assert r2.returncode == 0, r2.stderr[-3000:]
    assert "base: cached" in r2.stderr
