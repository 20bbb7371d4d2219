"""Pipeline parallelism through tools/train.py (PaddleFormers' Trainer, CPU, gloo): PP = 2 and PP = 2 x TP = 2 against
the same run in one process: the loss of every logged step, the validation loss, and the saved model/ (the
single-device format, one shard per stage); PP = 2's checkpoint-2 resumes at PP = 2 and in one process with the
uninterrupted run's losses. The pipe models themselves (one stage, PP = 2 through fleet's PipelineParallel) are
checked in tests/test_pipeline_parallel.py; this file is separate so that the suite's two workers (`--dist
loadfile`: a file is the unit of scheduling) can run the two halves at the same time.

The ranks run tests/tp/train_shimmed.py (ParallelEnv's device id; a rendezvous store per process group for 4 gloo
ranks), launched by tests/tp/launch.py; nothing is retried (docs/training.md, "Pipeline parallelism"). Printed
errors are max |diff| / max |ref| (worst tensor named).
"""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

from tp.launch import launch_train, ok, train_once

TOL = 1e-5


def _launch(nproc: int, log_dir, *args: str) -> str:
    """tools/train.py (shimmed) on nproc gloo ranks; a failed launch fails the test with the ranks' logs."""
    return ok(launch_train(log_dir, *args, nproc=nproc, shimmed=True, timeout=420)).output


TRAIN_MODEL = dict(hidden_size=64, num_hidden_layers=2, intermediate_size=176, head_dim=16, num_attention_heads=8,
                   num_key_value_heads=2, vha_postmix_rank=4, vocab_size=256, max_position_embeddings=512,
                   tie_word_embeddings=False, vha_fused_prologue=False)
# weight_decay 0: PaddleFormers' Trainer decays every parameter whose name holds neither "bias" nor "norm", and in a
# pipe model the final norm's weight is named "<stage layer index>.weight", so under PP it is decayed and in one
# process it is not (docs/training.md, "Pipeline parallelism": measured 1.6e-5 relative at step 4 with 0.01).
TRAIN_ARGS = dict(model_type="qwen3_vha", dataset="stdlib", corpus_mb=1, max_seq_len=32, device="cpu", seed=1,
                  do_train=True, do_eval=True, max_eval_samples=8, per_device_eval_batch_size=2, max_steps=4,
                  per_device_train_batch_size=2,
                  gradient_accumulation_steps=2, learning_rate=0.003, lr_scheduler_type="constant", weight_decay=0.0,
                  max_grad_norm=1.0, logging_steps=1, save_strategy="steps", save_steps=2, report_to="none",
                  disable_tqdm=True)
PP = ("--pipeline_model_parallel_size", "2", "--batch_p2p_comm", "false")


def _losses(run_dir: str) -> list:
    """The training loss of every step, then the validation losses (train_log.jsonl, in order)."""
    with open(os.path.join(run_dir, "train_log.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    return [r["loss"] for r in rows if "loss" in r] + [r["eval_loss"] for r in rows if "eval_loss" in r]


def _step_losses(run_dir: str) -> dict:
    with open(os.path.join(run_dir, "train_log.jsonl")) as f:
        return {r["step"]: r["loss"] for r in map(json.loads, f) if "loss" in r}


def _weights(folder: str) -> dict:
    from safetensors.numpy import load_file

    out = {}
    for name in sorted(os.listdir(folder)):
        if name.endswith(".safetensors"):
            out.update(load_file(os.path.join(folder, name)))
    return out


def _assert_same_model(label: str, got_dir: str, ref_dir: str) -> None:
    """got_dir/model holds the same tensors as ref_dir/model (names, shapes, values within TOL of the largest)."""
    from _utils import validate_vha_checkpoint

    validate_vha_checkpoint(os.path.join(got_dir, "model"))
    got, ref = _weights(os.path.join(got_dir, "model")), _weights(os.path.join(ref_dir, "model"))
    assert sorted(got) == sorted(ref), (sorted(set(got) ^ set(ref)))
    worst = max((float(np.abs(got[k].astype(np.float64) - ref[k]).max() / np.abs(ref[k]).max()), k) for k in ref)
    print(f"{label}: model/ {len(got)} tensors, files {sorted(f for f in os.listdir(os.path.join(got_dir, 'model')) if f.endswith('.safetensors'))}; "
          f"worst {worst[0]:.1e} ({worst[1]})")
    assert all(got[k].shape == ref[k].shape for k in ref) and worst[0] <= TOL, worst


def _plan_lines(log_dir) -> list:
    """The plan's line of every rank ("tensor parallel: rank k of t; vocabulary split by row; ..."), from its log."""
    import glob

    lines = []
    for path in sorted(glob.glob(os.path.join(str(log_dir), "workerlog.*"))):
        with open(path, errors="replace") as f:
            lines += [f"{os.path.basename(path)}: {line.strip()}" for line in f if "tensor parallel: rank" in line]
    return lines


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    """The starting checkpoint, the run's config, and the reference run in one process (checkpoint-2, model/)."""
    import paddle

    from paddle_vha.families import family

    tmp = tmp_path_factory.mktemp("pp-trainer")
    fam = family("qwen3_vha")
    paddle.seed(3)
    fam.model_class(fam.config_class(**TRAIN_MODEL)).save_pretrained(str(tmp / "init"))
    with open(tmp / "cfg.json", "w") as f:
        json.dump({**TRAIN_ARGS, "model_name_or_path": str(tmp / "init")}, f)
    cfg = str(tmp / "cfg.json")
    ok(train_once(cfg, "--output_dir", str(tmp / "one"), timeout=420))
    return cfg, str(tmp / "one")


@pytest.mark.slow
@pytest.mark.multirank
def test_trainer_pp2_equals_one_process_saves_and_resumes(one_process, tmp_path):
    """tools/train.py at pipeline_model_parallel_size 2 (2 micro-batches of 2 a step, AdamW, grad clipping) from the
    same starting checkpoint as the same run in one process: the same loss at every step, the same validation loss
    (the Trainer's pipeline evaluation), the same model/ (one shard per stage, validated). Its checkpoint-2 (whole
    tensors, PaddleFormers' flex-checkpoint under the pipe's name mapping) resumes at PP = 2 and in one process with
    the uninterrupted PP run's losses at steps 3-4."""
    cfg, one = one_process
    pp2 = str(tmp_path / "pp2")
    _launch(2, tmp_path / "log", cfg, *PP, "--output_dir", pp2)
    got, ref = _losses(pp2), _losses(one)
    dl = max(abs(a - b) / abs(b) for a, b in zip(got, ref))
    print(f"losses (4 steps, then validation) PP = 2 {got}\n       one process {ref}\nmax rel {dl:.1e}")
    assert len(ref) == len(got) > TRAIN_ARGS["max_steps"] and dl <= TOL
    _assert_same_model("PP = 2", pp2, one)

    ckpt = os.path.join(pp2, "checkpoint-2")
    _launch(2, tmp_path / "r" / "log", cfg, *PP, "--output_dir", str(tmp_path / "pp2-pp2"),
            "--resume_from_checkpoint", ckpt)
    ok(train_once(cfg, "--output_dir", str(tmp_path / "pp2-one"), "--resume_from_checkpoint", ckpt, timeout=420))
    want = _step_losses(pp2)
    for label in ("pp2-pp2", "pp2-one"):
        resumed = _step_losses(str(tmp_path / label))
        rel = max(abs(resumed[s] - want[s]) / abs(want[s]) for s in (3, 4))
        print(f"{label}: steps 3-4 {[resumed[s] for s in (3, 4)]} vs {[want[s] for s in (3, 4)]}; max rel {rel:.1e}")
        assert sorted(resumed) == [3, 4] and rel <= TOL, (label, resumed)


@pytest.mark.slow
@pytest.mark.multirank
def test_trainer_pp2_tp2_equals_one_process(one_process, tmp_path):
    """PP = 2 x TP = 2 on 4 gloo ranks (each stage built whole, then sharded by the family's plan over fleet's
    model-parallel group; the first stage's embedding and the last stage's head and cross-entropy split by vocabulary
    row, the default): the one-process run's losses and validation loss, and the model/ (saved whole) of the same run
    at TP = 2 without PP. (Against the one-process model/ the weights differ by up to ~3e-4 of the largest after 4 AdamW
    steps, as at TP = 2 alone: the all-reduce sums the partial products in another order, and AdamW's normalised step
    turns last-bit gradient differences into ~lr-sized ones; the losses still agree to 4e-7.)"""
    cfg, one = one_process
    out, tp2 = str(tmp_path / "pp2tp2"), str(tmp_path / "tp2")
    _launch(4, tmp_path / "log", cfg, *PP, "--tensor_parallel_degree", "2", "--output_dir", out)
    plans = _plan_lines(tmp_path / "log")
    print("\n".join(plans))
    assert len(plans) == 4 and all("vocabulary split by row" in line for line in plans), plans
    got, ref = _losses(out), _losses(one)
    dl = max(abs(a - b) / abs(b) for a, b in zip(got, ref))
    print(f"losses (4 steps, then validation) PP = 2 x TP = 2 {got}\n       one process {ref}\nmax rel {dl:.1e}")
    assert len(ref) == len(got) > TRAIN_ARGS["max_steps"] and dl <= TOL
    _launch(2, tmp_path / "t" / "log", cfg, "--tensor_parallel_degree", "2", "--output_dir", tp2)
    _assert_same_model("PP = 2 x TP = 2 vs TP = 2", out, tp2)


@pytest.mark.slow
@pytest.mark.multirank
def test_trainer_pp2_tied_head_with_clipping_equals_one_process(tmp_path):
    """A tied LM head under PP = 2 (the embedding on the first stage, its copy as the head on the last; fleet sums the
    two copies' gradients) with gradient clipping on: the clip's global norm must count the shared weight once
    (paddle_vha/modeling/pipe.py, count_shared_weights_once). The same losses as one process at every step and the
    same model/ (tie_word_embeddings: the head is the embedding, saved once). max_grad_norm 0.05 so that every step
    clips: a norm that counts the tied gradient twice changes every step's scale."""
    import paddle

    from paddle_vha.families import family

    fam = family("qwen3_vha")
    paddle.seed(5)
    fam.model_class(fam.config_class(**{**TRAIN_MODEL, "tie_word_embeddings": True})).save_pretrained(
        str(tmp_path / "init"))
    with open(tmp_path / "cfg.json", "w") as f:
        json.dump({**TRAIN_ARGS, "max_grad_norm": 0.05, "save_strategy": "no", "do_eval": False,
                   "model_name_or_path": str(tmp_path / "init")}, f)
    cfg = str(tmp_path / "cfg.json")
    one, pp2 = str(tmp_path / "one"), str(tmp_path / "pp2")
    ok(train_once(cfg, "--output_dir", one, timeout=420))
    _launch(2, tmp_path / "log", cfg, *PP, "--output_dir", pp2)
    got, ref = _losses(pp2), _losses(one)
    dl = max(abs(a - b) / abs(b) for a, b in zip(got, ref))
    print(f"tied, clipped: losses PP = 2 {got}\n       one process {ref}\nmax rel {dl:.1e}")
    assert len(ref) == len(got) == TRAIN_ARGS["max_steps"] and dl <= TOL
    _assert_same_model("PP = 2, tied", pp2, one)
