"""Checkpoints of 4-rank training through tools/train.py (CPU, gloo): TP = 4's checkpoint resumed at DP = 2 x TP = 2,
which saves its own. The helpers and the 2-rank layouts: tests/test_parallel_checkpoints.py (this file is separate so
that the suite's two workers, --dist loadfile, can run the two at once). Harness: tests/tp/launch.py (no retries).
"""
import os

import pytest

import test_parallel_checkpoints as pc
from tp.launch import launch_train


@pytest.mark.slow
@pytest.mark.multirank
def test_tp4_checkpoint_resumes_at_dp2_tp2_which_saves(tmp_path):
    """TP = 4 on 4 gloo ranks trains 8 steps; its checkpoint-4 records whole tensors and resumes at DP = 2 x TP = 2
    (same global batch) with the uninterrupted run's losses, and that run saves its own checkpoint-8 (under DP x TP
    PaddleFormers saves the optimizer on replica 0 only while flex-checkpoint waited for every rank: it deadlocked
    until paddle_vha/train/resume.py gave that save replica 0's group). 4 ranks go through tests/tp/train_shimmed.py
    (a rendezvous store per process group). TP 4 -> 4 / 2 / 1 and DP x TP -> DP x TP / TP 2 / TP 1 were run by hand:
    equal too (docs/training.md)."""
    cfg = pc._config(tmp_path)
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    run = launch_train(tmp_path / "la", cfg, "--tensor_parallel_degree", "4", "--output_dir", a, nproc=4,
                       shimmed=True)
    assert run.returncode == 0, run.output
    ref = pc._losses(a)
    ckpt = os.path.join(a, "checkpoint-4")
    shapes = pc._recorded_shapes(os.path.join(ckpt, "model_state"))
    print(f"TP = 4 checkpoint-4: gate_proj {shapes['model.layers.0.mlp.gate_proj.weight']}, "
          f"o_proj {shapes['model.layers.0.self_attn.o_proj.weight']}")
    assert shapes["model.layers.0.mlp.gate_proj.weight"] == (64, 176)
    assert shapes["model.layers.0.self_attn.o_proj.weight"] == (128, 64)
    run = launch_train(tmp_path / "lb", cfg, "--tensor_parallel_degree", "2", "--per_device_train_batch_size", "4",
                       "--output_dir", b, "--resume_from_checkpoint", ckpt, nproc=4, shimmed=True)
    assert run.returncode == 0, run.output
    pc._assert_same_losses("TP=4 -> DP=2 x TP=2", pc._losses(b), ref, range(5, pc.STEPS + 1))
    assert os.path.isfile(os.path.join(b, "checkpoint-8", "trainer_state.json"))
    assert pc._recorded_shapes(os.path.join(b, "checkpoint-8", "optimizer_state"))[
        "model.layers.0.mlp.gate_proj.weight.moment1_0"] == (64, 176)
