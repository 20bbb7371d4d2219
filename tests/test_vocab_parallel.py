"""Vocabulary parallelism (paddle_vha/parallel/vocab.py). tests/tp/vocab_worker.py on 2 ranks: the split embedding,
head and parallel cross-entropy against the single-device model (float32 and float64, tied and untied, split or
whole logits), and the order of the plan's gradient-summing hooks vs PaddleFormers' master-grad hook. Under
tools/train.py: TP = 2 with a tied head equals one process (losses, final weights); its checkpoint-4 records the
embedding as two row shards of the whole tensor and resumes in one process with the uninterrupted run's losses; a
vocabulary that does not divide by the degree is refused in one line. Harness: tests/tp/launch.py (no retries)."""
import json
import os

import numpy as np
import pytest

import test_parallel_checkpoints as pc
from tp.launch import launch, launch_train, train_once

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = pc.STEPS


def _config(tmp_path, **model) -> str:
    """test_parallel_checkpoints' run (8 steps, a checkpoint every 4) with a tied LM head (as Qwen3-0.6B)."""
    return pc._config(tmp_path, tie_word_embeddings=True, **model)


def _weights(folder) -> dict:
    from paddle_vha.checkpoint.folder import CheckpointFolder

    return CheckpointFolder.open(folder).read_all(float32=True)


def _embedding_parts(ckpt) -> list:
    """(local shape, global offset) of every part flex-checkpoint recorded for the embedding in model_state."""
    import paddle

    folder = os.path.join(ckpt, "model_state")
    meta = paddle.load(os.path.join(folder, next(f for f in os.listdir(folder) if f.endswith(".metadata"))))
    return sorted((tuple(p.local_shape), tuple(p.global_offset))
                  for p in meta.state_dict_metadata["model.embed_tokens.weight"])


def _launch_worker(tmp_path, timeout=300) -> dict:
    """tests/tp/vocab_worker.py on 2 CPU ranks; its rank files (a timeout kills every rank, nothing is retried)."""
    out = tmp_path / "out"
    out.mkdir()
    run = launch(os.path.join(ROOT, "tests", "tp", "vocab_worker.py"), "--out", out, log_dir=tmp_path / "logs",
                 timeout=timeout)
    ranks = sorted(out.glob("rank*.json"))
    assert run.returncode == 0 and len(ranks) == 2, run.output
    return {p.stem: json.loads(p.read_text()) for p in ranks}


@pytest.mark.slow
@pytest.mark.multirank
def test_vocab_parallel_equals_single_device_and_master_grads_follow_the_summing_hooks(tmp_path):
    results = _launch_worker(tmp_path)
    for rank, res in results.items():
        mg = res.pop("master_grad")
        for case, r in res.items():
            print(rank, case, {k: (f"{v:.1e}" if isinstance(v, float) else v) for k, v in r.items()})
            fp64_whole = case.startswith("float64") and case.endswith("tp_output0")
            # PaddleFormers' criterion takes the cross-entropy in float32 even for a float64 model
            bound = 1e-12 if fp64_whole else 1e-5
            assert max(r["loss"], r["grads"], r.get("logits", 0.0)) <= bound, (case, r)
            assert r["embedding_rows"] == 48 and r["logits_width"] == (48 if case.endswith("tp_output1") else 96)
            assert r["tied_kept"] == (".tied1." in case)
        print(rank, "master grads", mg)
        assert mg["main_grads"] <= 1e-5 and mg["grads_left"] == []  # two micro-batches accumulated in main_grad
        assert "already carries master-grad hooks" in mg["wrapped_first"]


@pytest.mark.slow
@pytest.mark.multirank
def test_tp2_vocab_parallel_tied_head_equals_one_process_and_resumes_at_tp1(tmp_path):
    cfg = _config(tmp_path)
    a, b, c = (str(tmp_path / k) for k in ("tp2", "one", "resumed"))
    run = launch_train(tmp_path / "la", cfg, "--output_dir", a)
    assert run.returncode == 0, run.output
    run = train_once(cfg, "--tensor_parallel_degree", "1", "--output_dir", b)
    assert run.returncode == 0, run.output
    pc._assert_same_losses("TP=2 (vocab parallel) vs one process", pc._losses(a), pc._losses(b), range(1, STEPS + 1))

    w_tp, w_one = _weights(os.path.join(a, "model")), _weights(os.path.join(b, "model"))
    assert sorted(w_tp) == sorted(w_one) and "lm_head.weight" not in w_tp  # tied: the head is the embedding
    err = {n: float(np.abs(w_tp[n] - w_one[n]).max() / np.abs(w_one[n]).max()) for n in w_one}
    worst = max(err, key=err.get)
    print(f"final weights, TP=2 merged vs one process: worst {worst} {err[worst]:.2e}; "
          f"embedding {err['model.embed_tokens.weight']:.2e}")
    assert err[worst] <= 1e-4  # AdamW in fp32 (docs/tensor_parallel.md, "Exactness")

    ckpt = os.path.join(a, "checkpoint-4")
    parts = _embedding_parts(ckpt)
    print(f"checkpoint-4 model.embed_tokens.weight parts: {parts}")
    assert parts == [((128, 64), (0, 0)), ((128, 64), (128, 0))]  # two vocabulary-row shards of the [256, 64] tensor
    run = train_once(cfg, "--tensor_parallel_degree", "1", "--output_dir", c, "--resume_from_checkpoint", ckpt)
    assert run.returncode == 0, run.output
    pc._assert_same_losses("TP=2 (vocab parallel) -> TP=1", pc._losses(c), pc._losses(a), range(5, STEPS + 1))


def test_vocabulary_not_divisible_by_the_degree_is_refused_in_one_line(tmp_path):
    out = tmp_path / "out"
    run = train_once(_config(tmp_path, vocab_size=257), "--dry_run", "--output_dir", out)
    err = [line for line in run.output.splitlines() if line.startswith("error:")]
    print(err)
    assert run.returncode == 2 and len(err) == 1, run.output
    assert "vocab_size=257 is not divisible by the tensor-parallel size t=2" in err[0]
    assert not out.exists()


def test_fused_head_and_loss_with_the_split_head_is_refused_in_one_line(tmp_path):
    """PaddleFormers' fused head + loss reads fleet's mp layers (it failed in calc_lm_head_logits: 'NoneType' object
    has no attribute 'is_distributed'); with the vocabulary-parallel head it is refused before anything is built."""
    out = tmp_path / "out"
    run = train_once(_config(tmp_path), "--use_fused_head_and_loss_fn", "true", "--dry_run", "--output_dir", out)
    err = [line for line in run.output.splitlines() if line.startswith("error:")]
    print(err)
    assert run.returncode == 2 and len(err) == 1, run.output
    assert "use_fused_head_and_loss_fn with the vocabulary-parallel LM head is not supported" in err[0]
    assert not out.exists()
