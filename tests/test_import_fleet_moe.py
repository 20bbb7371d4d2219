"""tools/import_fleet.py on upstream PaddleFleet VHA + MoE checkpoints (written in numpy by tests/moe_checkpoints.py from
a Qwen3-MoE-VHA model: Paddle [in, out] layout, per-expert or grouped-GEMM fused gate | up, router [E, h], a shared
expert with its sigmoid gate, a dense layer among the MoE layers): the imported tensors are the model's exactly, and
upstream's forward (paddle_vha/transform/fleet_reference.py) matches the independent oracle (tests/moe_oracle.py)."""
import os
import subprocess
import sys

import numpy as np
import pytest

import moe_oracle
from moe_checkpoints import MOE_VHA, add_shared_expert, moe_vha_tensors, to_upstream, upstream_config, write_checkpoint
from paddle_vha.checkpoint.folder import CheckpointFolder
from paddle_vha.families import family
from paddle_vha.transform.fold import FoldError, plan_fold
from paddle_vha.transform.import_fleet import FleetImportError, plan_import
from test_moe_vha import read_folder

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
IDS = np.random.default_rng(2).integers(0, MOE_VHA["vocab_size"], (2, 11))


def make_upstream(folder, grouped=False, shared=10, seed=0):
    """(our-format float64 tensors of the model, its config dict) and the upstream checkpoint written from them."""
    c = dict(MOE_VHA)
    t = moe_vha_tensors(c, seed)
    if shared:
        add_shared_expert(t, c, shared)
    t = {k: v.astype(np.float32).astype(np.float64) for k, v in t.items()}  # what float32 storage holds
    write_checkpoint(folder, upstream_config(c, shared, gated=bool(shared)), to_upstream(t, grouped))
    return t, dict(c, moe_shared_expert_intermediate_size=shared, moe_shared_expert_gate=bool(shared))


def run_tool(*args):
    r = subprocess.run([sys.executable, "tools/import_fleet.py", *map(str, args), "--no-progress"], capture_output=True,
                       text=True, cwd=ROOT)
    print(r.stdout[-2500:], r.stderr[-1500:])
    return r


@pytest.mark.parametrize("grouped", [False, True], ids=["per-expert", "grouped-gemm"])
def test_import_moe_vha_and_verify(tmp_path, grouped):
    t, c = make_upstream(tmp_path / "fleet", grouped=grouped)
    r = run_tool(tmp_path / "fleet", tmp_path / "ours", "--up-gate-order", "gate-up", "--verify", "--verify-tol", "1e-10")
    assert r.returncode == 0, r.stderr
    verify = [ln for ln in r.stdout.splitlines() if ln.startswith("verify")]
    assert verify and verify[0].endswith("-> OK") and "float64 numpy" in verify[0]
    cfg = family("qwen3_moe_vha").validate(str(tmp_path / "ours"))
    assert cfg.moe_layer_indices == [0, 2] and cfg.moe_shared_expert_intermediate_size == 10
    got, out_cfg = read_folder(tmp_path / "ours")
    assert set(got) == set(t) and all(np.array_equal(got[n], t[n]) for n in t), "every tensor is the model's"
    # upstream's forward on the upstream tensors (the package's reference) vs the independent oracle of the model
    from paddle_vha.transform.fleet_reference import reference_logits
    from paddle_vha.transform.import_fleet import reference_names
    ck = CheckpointFolder.open(str(tmp_path / "fleet"))
    up = reference_logits(IDS, lambda n: ck.read(n).astype(np.float64), reference_names(ck), cfg, "paddle", "grouped",
                          "gate-up")
    ref = moe_oracle.logits(IDS, t, out_cfg)
    err = np.abs(up - ref).max() / np.abs(ref).max()
    print(f"upstream forward (fleet_reference) vs oracle: max rel {err:.2e}")
    assert err <= 1e-10


def test_shared_expert_import_does_not_fold(tmp_path):
    make_upstream(tmp_path / "fleet")
    plan = plan_import(str(tmp_path / "fleet"), str(tmp_path / "ours"), up_gate_order="gate-up")
    from paddle_vha.transform.import_fleet import import_checkpoint
    import_checkpoint(plan, progress=False)
    with pytest.raises(FoldError, match="a shared expert .* stock Qwen3-MoE has none"):
        plan_fold(str(tmp_path / "ours"), str(tmp_path / "folded"))


@pytest.mark.parametrize("over, match", [
    (dict(scoring_func="sigmoid"), "scoring_func='sigmoid': Qwen3-MoE's router is a softmax"),
    (dict(topk_method="noaux_tc"), "topk_method='noaux_tc'"),
    (dict(routed_scaling_factor=2.5), "routed_scaling_factor=2.5"),
    (dict(num_experts_per_tok=9), "num_experts_per_tok=9 exceeds num_experts=6"),
])
def test_upstream_moe_config_refusals(tmp_path, over, match):
    c = dict(MOE_VHA)
    t = moe_vha_tensors(c)
    write_checkpoint(tmp_path / "fleet", dict(upstream_config(c), **over), to_upstream(t))
    with pytest.raises(FleetImportError, match=match) as e:
        plan_import(str(tmp_path / "fleet"), str(tmp_path / "ours"), up_gate_order="gate-up")
    print(e.value)
    assert "\n" not in str(e.value) and not os.path.exists(tmp_path / "ours")


def test_fused_expert_needs_up_gate_order_and_bias_refused(tmp_path):
    c = dict(MOE_VHA)
    t = to_upstream(moe_vha_tensors(c))
    write_checkpoint(tmp_path / "a", upstream_config(c), t)
    with pytest.raises(FleetImportError, match="pass --up-gate-order"):
        plan_import(str(tmp_path / "a"), str(tmp_path / "o"))
    t["layers.0.mlp.gate.e_score_correction_bias"] = np.zeros(6)
    write_checkpoint(tmp_path / "b", upstream_config(c), t)
    with pytest.raises(FleetImportError, match="router correction bias"):
        plan_import(str(tmp_path / "b"), str(tmp_path / "o"), up_gate_order="gate-up")
