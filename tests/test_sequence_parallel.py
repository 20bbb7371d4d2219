"""Sequence parallelism (paddle_vha/parallel/sequence.py) through tools/train.py on 2 CPU ranks: TP = 2 with
`sequence_parallel` (and the vocabulary split, the default) equals one process (losses, final merged weights), and its
checkpoint-4 resumes in one process with the uninterrupted run's losses. One launch (tests/tp/launch.py, no retries);
what cannot run with it is refused in one line before anything is built."""
import os

import numpy as np
import pytest

import test_parallel_checkpoints as pc
from tp.launch import launch_train, train_once

STEPS = pc.STEPS


def _weights(folder) -> dict:
    from paddle_vha.checkpoint.folder import CheckpointFolder

    return CheckpointFolder.open(folder).read_all(float32=True)


@pytest.mark.slow
@pytest.mark.multirank
def test_tp2_sequence_parallel_equals_one_process_and_resumes_at_tp1(tmp_path):
    cfg = pc._config(tmp_path, tie_word_embeddings=True, attention_bias=True)  # o_proj's bias: summed under SP
    a, b, c = (str(tmp_path / k) for k in ("sp", "one", "resumed"))
    run = launch_train(tmp_path / "la", cfg, "--sequence_parallel", "true", "--output_dir", a)
    assert run.returncode == 0, run.output
    plan = [line for line in (tmp_path / "la" / "workerlog.0").read_text().splitlines()
            if line.startswith("tensor parallel:")]
    print(plan)  # 2 layers x (input_layernorm, post_attention_layernorm, o_proj.bias) + model.norm
    assert plan and "vocabulary split by row; sequence-parallel (7 weights" in plan[0]
    run = train_once(cfg, "--tensor_parallel_degree", "1", "--output_dir", b)
    assert run.returncode == 0, run.output
    pc._assert_same_losses("TP=2 + SP vs one process", pc._losses(a), pc._losses(b), range(1, STEPS + 1))

    w_sp, w_one = _weights(os.path.join(a, "model")), _weights(os.path.join(b, "model"))
    assert sorted(w_sp) == sorted(w_one)
    err = {n: float(np.abs(w_sp[n] - w_one[n]).max() / np.abs(w_one[n]).max()) for n in w_one}
    worst = max(err, key=err.get)
    norms = max(v for n, v in err.items() if "norm" in n or n.endswith("o_proj.bias"))
    print(f"final weights, TP=2 + SP merged vs one process: worst {worst} {err[worst]:.2e}; "
          f"norms and o_proj bias (gradients summed under SP) {norms:.2e}")
    assert err[worst] <= 1e-5

    ckpt = os.path.join(a, "checkpoint-4")
    run = train_once(cfg, "--tensor_parallel_degree", "1", "--output_dir", c, "--resume_from_checkpoint", ckpt)
    assert run.returncode == 0, run.output
    pc._assert_same_losses("TP=2 + SP -> TP=1", pc._losses(c), pc._losses(a), range(5, STEPS + 1))


@pytest.mark.parametrize("extra, message", [
    (["--max_seq_len", "63"], "sequence length 63 is not divisible by the tensor-parallel size t=2"),
    (["--tensor_parallel_degree", "1"], "it takes effect with tensor parallelism"),
])
def test_sequence_parallel_it_cannot_run_is_refused_in_one_line(tmp_path, extra, message):
    out = tmp_path / "out"
    run = train_once(pc._config(tmp_path), "--sequence_parallel", "true", *extra, "--dry_run", "--output_dir", out)
    err = [line for line in run.output.splitlines() if line.startswith("error:")]
    print(err)
    assert run.returncode == 2 and len(err) == 1, run.output
    assert message in err[0]
    assert not out.exists()
