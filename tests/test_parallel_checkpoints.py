"""Checkpoints of multi-rank training through tools/train.py (CPU, gloo): complete, resumable at another layout, refused
when they cannot be; data parallelism that saves without a deadlock. Harness: tests/tp/launch.py (no retries).

Each launch costs ~20-40 s here, so each test makes as few as it can and asserts everything on them. The 4-rank
layouts (TP = 4 resumed at DP = 2 x TP = 2) are in tests/test_parallel_checkpoints_tp4.py, a file of its own so that
the suite's two workers (--dist loadfile) can run it beside this one.
"""
import json
import os
import shutil

import pytest

from tp.launch import launch_train, train_once

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = 8  # checkpoint-4 is resumed; steps 5..8 are compared with the uninterrupted run


def _config(tmp_path, **model) -> str:
    """configs/tiny-vha-tp2.json (TP = 2), 8 steps of batch 8 x 64 bytes, a checkpoint every 4, a loss every step;
    `model` overrides model_config fields."""
    with open(os.path.join(ROOT, "configs", "tiny-vha-tp2.json")) as f:
        cfg = json.load(f)
    cfg["model_config"]["vha_fused_prologue"] = False  # the composed prologue: no operator build inside the ranks
    cfg["model_config"].update(model)
    cfg.update(max_steps=STEPS, save_steps=4, save_strategy="steps", logging_steps=1, do_eval=False)
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps(cfg))
    return str(path)


def _losses(run_dir) -> dict:
    with open(os.path.join(run_dir, "train_log.jsonl")) as f:
        return {r["step"]: r["loss"] for r in map(json.loads, f) if "loss" in r}


def _assert_same_losses(label, got: dict, ref: dict, steps) -> None:
    rel = {s: abs(got[s] - ref[s]) / abs(ref[s]) for s in steps}
    print(f"{label}: " + "  ".join(f"step {s} {got[s]:.8f} vs {ref[s]:.8f}" for s in steps)
          + f"; max rel {max(rel.values()):.2e}")
    assert sorted(got) == list(steps), got
    assert max(rel.values()) <= 1e-5, (label, rel)


def _recorded_shapes(folder) -> dict:
    from paddle_vha.train.resume import saved_global_shapes

    return saved_global_shapes(folder)


def _as_old_half_tensor_checkpoint(src, dest) -> None:
    """A copy of checkpoint `src` whose model_state records every split tensor as its rank-0 slice, whole (what the
    save wrote before the split parameters were declared: one rank's half recorded as the tensor)."""
    import paddle

    shutil.copytree(src, dest)
    folder = os.path.join(dest, "model_state")
    meta_file = os.path.join(folder, next(f for f in os.listdir(folder) if f.endswith(".metadata")))
    meta = paddle.load(meta_file)
    for name, parts in meta.state_dict_metadata.items():
        first = [p for p in parts if not any(p.global_offset)][:1]
        meta.state_dict_metadata[name] = [type(p)(global_offset=p.global_offset, local_shape=p.local_shape,
                                                  dtype=p.dtype, global_shape=p.local_shape) for p in first]
    paddle.save(meta, meta_file)


@pytest.mark.slow
@pytest.mark.multirank
def test_tp2_checkpoint_is_whole_and_resumes_at_tp2_and_tp1(tmp_path):
    """TP = 2 trains 8 steps; its checkpoint-4 records whole tensors (weights and AdamW moments) and resumes at TP = 2
    and in one process (TP = 1) with the uninterrupted run's losses; the same checkpoint recorded the old way (one
    rank's slice as the whole tensor) is refused in one line, nothing written."""
    cfg = _config(tmp_path)
    a, b, c, old_out = (str(tmp_path / k) for k in ("a", "b", "c", "old_out"))
    run = launch_train(tmp_path / "la", cfg, "--output_dir", a)
    assert run.returncode == 0, run.output
    ref = _losses(a)
    assert sorted(ref) == list(range(1, STEPS + 1))
    ckpt = os.path.join(a, "checkpoint-4")

    shapes = _recorded_shapes(os.path.join(ckpt, "model_state"))
    moments = _recorded_shapes(os.path.join(ckpt, "optimizer_state"))
    for name, whole in (("model.layers.0.mlp.gate_proj.weight", (64, 176)),  # column-parallel, [in, out] in memory
                        ("model.layers.0.self_attn.o_proj.weight", (128, 64)),  # row-parallel
                        ("model.layers.1.self_attn.vha_premix_weight", (2, 16, 16))):  # one KV group per rank
        print(f"{name}: recorded {shapes[name]}, moment1 {moments[name + '.moment1_0']}")
        assert shapes[name] == whole and moments[name + ".moment1_0"] == whole
        assert moments[name + ".moment2_0"] == whole

    run = launch_train(tmp_path / "lb", cfg, "--output_dir", b, "--resume_from_checkpoint", ckpt)
    assert run.returncode == 0, run.output
    _assert_same_losses("TP=2 -> TP=2", _losses(b), ref, range(5, STEPS + 1))
    run = train_once(cfg, "--tensor_parallel_degree", "1", "--output_dir", c, "--resume_from_checkpoint", ckpt)
    assert run.returncode == 0, run.output
    _assert_same_losses("TP=2 -> TP=1", _losses(c), ref, range(5, STEPS + 1))

    _as_old_half_tensor_checkpoint(ckpt, tmp_path / "old")
    run = train_once(cfg, "--tensor_parallel_degree", "1", "--output_dir", old_out,
                     "--resume_from_checkpoint", tmp_path / "old")
    err = [line for line in run.output.splitlines() if line.startswith("error:")]
    print(err)
    assert run.returncode == 2 and len(err) == 1, run.output
    assert "cannot resume from" in err[0] and "kept one rank's slice" in err[0]
    assert "lm_head.weight as [128, 64], the model's is [256, 64]" in err[0]  # the first by name (vocabulary-split)
    assert not os.path.exists(old_out)


@pytest.mark.slow
@pytest.mark.multirank
def test_dp2_refuses_or_trains_saves_and_resumes(tmp_path):
    """Two ranks without tensor parallelism (CPU): refused in one line naming the setting by default (Paddle's
    DataParallel reducer does not sum gradients here); with recompute_granularity full (PaddleFormers all-reduces the
    gradients itself) it trains, saves checkpoint-N/model and the final model collectively (no deadlock: the launch
    would time out), and its checkpoint-4 resumes on 2 ranks with its losses and in one process with its weights."""
    from _utils import validate_vha_checkpoint

    cfg = _config(tmp_path)
    dp = ["--tensor_parallel_degree", "1", "--per_device_train_batch_size", "4"]  # global batch 8, as TP = 2
    a, b, c, refused = (str(tmp_path / k) for k in ("a", "b", "c", "refused"))
    run = launch_train(tmp_path / "l0", cfg, *dp, "--output_dir", refused)
    err = [line for line in run.output.splitlines() if line.startswith("error:")]
    assert run.returncode != 0 and err, run.output
    assert "recompute_granularity full" in err[0] and "data parallelism" in err[0], err
    assert not os.path.exists(os.path.join(refused, "checkpoint-4"))

    run = launch_train(tmp_path / "la", cfg, *dp, "--recompute_granularity", "full", "--output_dir", a)
    assert run.returncode == 0, run.output
    for folder in ("checkpoint-4/model", "checkpoint-8/model", "model"):
        validate_vha_checkpoint(os.path.join(a, folder))
        assert not any(f.startswith("saved_signal") for f in os.listdir(os.path.join(a, folder)))
    ref = _losses(a)
    ckpt = os.path.join(a, "checkpoint-4")
    run = launch_train(tmp_path / "lb", cfg, *dp, "--recompute_granularity", "full", "--output_dir", b,
                       "--resume_from_checkpoint", ckpt)
    assert run.returncode == 0, run.output
    _assert_same_losses("DP=2 -> DP=2", _losses(b), ref, range(5, STEPS + 1))

    run = train_once(cfg, "--tensor_parallel_degree", "1", "--output_dir", c, "--resume_from_checkpoint", ckpt)
    assert run.returncode == 0, run.output
    got = _losses(c)
    # The weights come back exactly (step 5's loss). Later steps sum the batch's gradient in another order than the
    # two replicas did, and AdamW's g / (|g| + eps) turns last-bit differences into ~1e-4 (docs/training.md).
    _assert_same_losses("DP=2 -> 1 process, step 5", {5: got[5]}, ref, [5])
    drift = max(abs(got[s] - ref[s]) / ref[s] for s in range(6, STEPS + 1))
    print(f"DP=2 -> 1 process, steps 6-8: max rel {drift:.2e}")
    assert sorted(got) == list(range(5, STEPS + 1)) and drift < 1e-3


@pytest.mark.slow
@pytest.mark.multirank
def test_sharding_stage1_trains_saves_and_resumes(tmp_path):
    """Sharding stage 1 on 2 CPU ranks (the PaddleNLP-era name sharding_parallel_degree; stage1 v1 in float32 by
    tools/train.py's defaults) equals one process with the same global batch, saves checkpoint-N and model/, and its
    checkpoint-4 resumes at sharding 2 and in one process with the uninterrupted run's losses. It failed inside Paddle
    (`The tensor must be contiguous`) until Premix's gradient was made contiguous (tests/tp/sharding_probe.py shows
    Paddle's limit on its own)."""
    from _utils import validate_vha_checkpoint

    cfg = _config(tmp_path)
    sh = ["--tensor_parallel_degree", "1", "--sharding_parallel_degree", "2", "--per_device_train_batch_size", "4"]
    a, b, c, one = (str(tmp_path / k) for k in ("a", "b", "c", "one"))
    run = launch_train(tmp_path / "la", cfg, *sh, "--output_dir", a)
    assert run.returncode == 0, run.output
    import paddle

    args = paddle.load(os.path.join(a, "checkpoint-4", "training_args.bin"))  # what the Trainer ran
    print(f"sharding {[o.value for o in args.sharding]}, degree {args.sharding_parallel_size}")
    assert [o.value for o in args.sharding] == ["stage1"] and args.sharding_parallel_size == 2
    validate_vha_checkpoint(os.path.join(a, "model"))
    run = train_once(cfg, "--tensor_parallel_degree", "1", "--output_dir", one)
    assert run.returncode == 0, run.output
    ref = _losses(a)
    _assert_same_losses("sharding 2 vs one process", ref, _losses(one), range(1, STEPS + 1))

    ckpt = os.path.join(a, "checkpoint-4")
    run = launch_train(tmp_path / "lb", cfg, *sh, "--output_dir", b, "--resume_from_checkpoint", ckpt)
    assert run.returncode == 0, run.output
    _assert_same_losses("sharding 2 -> sharding 2", _losses(b), ref, range(5, STEPS + 1))
    run = train_once(cfg, "--tensor_parallel_degree", "1", "--output_dir", c, "--resume_from_checkpoint", ckpt)
    assert run.returncode == 0, run.output
    _assert_same_losses("sharding 2 -> one process", _losses(c), ref, range(5, STEPS + 1))
