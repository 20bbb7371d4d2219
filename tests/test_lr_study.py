"""tools/lr_study.py (tools/experiments/lr_study.py): its measuring parts (tools/experiments/scaling.py) against known
answers, and the tool run small."""
import json
import math
import os
import subprocess
import sys
import types

import numpy as np
import pytest
from strict_json import strict_json

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# --- the power-law fit and the spike detector ----------------------------------------------------------------------

def test_power_law_fit_recovers_known_curves():
    from tools.experiments.scaling import fit_power_law

    t = np.linspace(2e4, 3e5, 12)
    for a, alpha, linf in ((40.0, 0.4, 1.3), (900.0, 0.7, 2.1), (5.0, 0.15, 0.6)):
        y = a * t ** -alpha + linf
        f = fit_power_law(t, y)
        print(f"true A {a} alpha {alpha} L_inf {linf} -> {f}")
        assert f["alpha"] == pytest.approx(alpha, rel=1e-4) and f["L_inf"] == pytest.approx(linf, abs=1e-4)
        assert f["at_bound"] is None and f["rms"] < 1e-8
        if alpha >= 0.4:  # (a slow power law over one decade leaves L_inf weakly determined once noise is added)
            noisy = fit_power_law(t, y + np.random.default_rng(0).normal(0, 0.003, len(t)))
            assert abs(noisy["L_inf"] - linf) < 5 * noisy["L_inf_se"] + 0.05
    # a straight, still-falling line has no asymptote inside the bounds: the fit says so instead of inventing one
    f = fit_power_law(t, 5.0 - t / 1e5)
    assert f["at_bound"] is not None and 0.0 <= f["L_inf"] <= 5.0 - t.max() / 1e5
    assert fit_power_law(t[:3], t[:3]) is None


def test_spike_detector():
    from tools.experiments.scaling import spike_report

    args = types.SimpleNamespace(smooth=5, spike_rel=0.10, spike_abs=0.2, recover=20)
    steps = np.arange(150)
    smooth = 2.0 + 3.0 * np.exp(-steps / 20)
    assert spike_report(smooth, args) == (False, False, None)
    bump = smooth.copy()
    bump[80:90] += 1.0  # a transient rise that comes back within 20 steps
    assert spike_report(bump, args)[:2] == (False, False)
    jump = smooth.copy()
    jump[100:] += 1.5  # a sharp rise that never recovers
    spiked, diverged, at = spike_report(jump, args)
    assert spiked and not diverged and 100 <= at <= 106
    nan = list(smooth[:40]) + [float("nan")]
    assert spike_report(nan, args) == (False, True, 40)
    collapsed = np.concatenate([smooth[:30], np.full(120, math.log(256))])  # forgot everything: uniform over bytes
    assert spike_report(collapsed, args)[:2] == (True, True)


# --- the tool, run small ----------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_lr_study_runs_small(tmp_path):
    r = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "lr_study.py"), "--seeds", "0", "1", "--steps", "16",
                        "--warmup", "2", "--evals", "4", "--val-batches", "1", "--batch-size", "4", "--hidden", "32",
                        "--rates", "1e-3", "1e9", "--long-factor", "2", "--corpus-mb", "1", "--out", str(tmp_path),
                        "--no-progress"], capture_output=True, text=True, timeout=900, cwd=ROOT)
    print(r.stdout[-4000:])
    assert r.returncode == 0, r.stderr[-3000:]
    data = strict_json(tmp_path / "lr_study.json")
    assert len(data["runs"]) == 2 * 2 * 4
    huge = [x for x in data["runs"] if x["rate"] == 1e9]
    assert all(x["diverged"] and x["val"] is None for x in huge)  # diverged counts as diverged, never as a number
    assert all(data["stats"][v]["1000000000.0"]["diverged"] == 2 for v in ("Qwen3", "MEA", "MEA no-norm", "VHA"))
    md = open(tmp_path / "lr_study.md").read()
    assert "(1) 'MEA stays stable" in md and "(3) 'the variant without GroupNorm" in md and "(4) Short-run fit" in md
    assert open(tmp_path / "lr_study.png", "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    assert len(data["long_runs"]) == 4 and all(x["steps"] == 32 for x in data["long_runs"])
    before = open(tmp_path / "lr_study.md").read()
    r = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "lr_study.py"), "--render",
                        str(tmp_path / "lr_study.json")], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    assert open(tmp_path / "lr_study.md").read() == before  # the saved JSON alone reproduces the report
