"""Pipeline parallelism: each trainable family's pipe model (paddle_vha/modeling/pipe.py) on CPU, exact against the
plain causal LM.

* registry: every family the project trains has a pipe class on PaddleFormers' GeneralModelForCausalLMPipe whose
  decoder layer is the family's;
* one stage (one process, tests/pp/pp_worker.py --mode single): logits, loss and every gradient of the pipe model
  equal the plain model's with the same weights (fp32), for Qwen3-VHA, shared-KV VHA, Qwen3-MEA and Qwen3 shared-KV;
  and, as the control that the check can fail, PaddleFormers' own pipe layer (no causal mask for the eager backend)
  does not;
* PP = 2 on 2 gloo ranks (one launch, --mode pp2): 3 SGD-momentum steps of 2 micro-batches through fleet's
  PipelineParallel give the plain model's loss at every step and its parameters on each stage (tied LM head too);
* PP = 2 and PP = 2 x TP = 2 through tools/train.py (PaddleFormers' Trainer) against the same run in one process: the
  loss of every logged step, the validation loss, and the saved model/ (the single-device format, one shard per
  stage); PP = 2's checkpoint-2 resumes at PP = 2 and in one process with the uninterrupted run's losses.

The CPU shims (ParallelEnv's device id; one stage's no-recompute query; a barrier after each new_group for 4 gloo
ranks) are in tests/pp/ and tests/tp/train_shimmed.py, not in the product
(docs/training.md, "Pipeline parallelism"). Printed errors are max |diff| / max |ref| (worst tensor named).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER = os.path.join(ROOT, "tests", "pp", "pp_worker.py")
TRAIN = os.path.join(ROOT, "tests", "tp", "train_shimmed.py")
CASES = ["vha", "vha-tied", "vha-shared-kv", "mea", "skv"]
TOL = 1e-5


def _run(cmd, out_dir: str, timeout: int = 420) -> str:
    """Run cmd (a launcher or one process) in its own session; the output, or a test failure with its tail. No retry:
    a failed launch fails the test."""
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True, text=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        out, _ = proc.communicate()
        pytest.fail(f"timed out after {timeout}s:\n{out[-3000:]}")
    if proc.returncode != 0:
        logs = ""
        for name in sorted(os.listdir(os.path.join(out_dir, "log"))) if os.path.isdir(os.path.join(out_dir, "log")) \
                else []:
            if name.startswith("workerlog"):
                logs += f"--- {name}\n" + open(os.path.join(out_dir, "log", name), errors="replace").read()[-2500:]
        pytest.fail(f"exit {proc.returncode}:\n{out[-2500:]}\n{logs}")
    return out


def _launch(nproc: int, out_dir: str, script: str, *args: str) -> str:
    return _run([sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", str(nproc), "--log_dir",
                 os.path.join(out_dir, "log"), script, *args], out_dir)


def _results(out_dir: str, mode: str, nproc: int) -> list:
    res = []
    for k in range(nproc):
        with open(os.path.join(out_dir, f"{mode}-rank{k}.json")) as f:
            res.append(json.load(f))
        assert "error" not in res[-1], res[-1]["error"]
    return res


def test_every_trainable_family_has_a_pipe_model():
    from paddleformers.nn.pp_model import GeneralModelForCausalLMPipe

    from paddle_vha.families import trainable_with_plan

    for fam in trainable_with_plan():
        pipe = fam.pipe_class
        assert pipe is not None and issubclass(pipe, GeneralModelForCausalLMPipe), fam.label
        layer = pipe._decoder_layer_cls
        assert layer.__module__ == fam.model_class.__module__ and layer.__name__.endswith("DecoderLayer"), layer
        assert pipe.config_class is fam.config_class and pipe.causal_lm_class is fam.model_class


def test_pipe_refuses_sliding_window_layers():
    from paddle_vha.families import family

    fam = family("qwen3_vha")
    cfg = fam.config_class(vocab_size=97, hidden_size=48, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=3,
                           use_sliding_window=True, layer_types=["sliding_attention", "full_attention"])
    with pytest.raises(ValueError, match="pipeline parallelism: Qwen3-VHA with sliding-window layers"):
        fam.pipe_class(cfg)  # refused before anything is built (no fleet topology needed)


# One stage holds both ends of a tied LM head, which PaddleFormers' pipe cannot run (the shared layer is called as the
# embedding at the head: "embedding input only support int32 and int64"); PP = 2 runs the tied case.
SINGLE_CASES = [c for c in CASES if c != "vha-tied"]


def test_one_stage_pipe_equals_plain_model(tmp_path):
    _run([sys.executable, WORKER, "--out", str(tmp_path), "--mode", "single", "--cases", ",".join(SINGLE_CASES)],
         str(tmp_path))
    (res,) = _results(str(tmp_path), "single", 1)
    for case in SINGLE_CASES:
        r = res["cases"][case]
        print(f"{case}: logits {r['logits']['rel']:.1e}  loss {r['loss']['rel']:.1e}  grads {r['grads']['rel']:.1e} "
              f"({r['grads']['name']}, {r['grads']['count']} tensors); layer {r['layer_class']}; PaddleFormers' own "
              f"pipe layer: logits {r['stock_layer_logits']['rel']:.2f}")
        assert r["logits"]["rel"] <= 1e-6 and r["loss"]["rel"] <= 1e-6 and r["grads"]["rel"] <= 1e-6, (case, r)
        assert r["stock_layer_logits"]["rel"] > 1e-2, "the control: without the causal mask the logits must differ"


@pytest.mark.slow
@pytest.mark.multirank
def test_pp2_equals_one_process(tmp_path):
    _launch(2, str(tmp_path), WORKER, "--out", str(tmp_path), "--mode", "pp2", "--cases", ",".join(CASES))
    ranks = _results(str(tmp_path), "pp2", 2)
    for case in CASES:
        r0, r1 = ranks[0]["cases"][case], ranks[1]["cases"][case]
        assert (r0["stage"], r1["stage"]) == (0, 1)
        assert not set(r0["stage_params"]) & set(r1["stage_params"]) - {"lm_head.weight", "model.embed_tokens.weight"}
        for r in (r0, r1):
            dl = max(abs(a - b) / abs(b) for a, b in zip(r["losses"], r["ref_losses"]))
            print(f"{case} stage {r['stage']}: losses {[round(x, 6) for x in r['losses']]} vs one process "
                  f"{[round(x, 6) for x in r['ref_losses']]} (max rel {dl:.1e}); parameters after 3 steps "
                  f"{r['params']['rel']:.1e} ({r['params']['name']}, {r['params']['count']} tensors)")
            assert dl <= TOL and r["params"]["rel"] <= TOL, (case, r)


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
    _run([sys.executable, os.path.join(ROOT, "tools", "train.py"), cfg, "--output_dir", str(tmp / "one")], str(tmp))
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
    _launch(2, str(tmp_path), TRAIN, cfg, *PP, "--output_dir", pp2)
    got, ref = _losses(pp2), _losses(one)
    dl = max(abs(a - b) / abs(b) for a, b in zip(got, ref))
    print(f"losses (4 steps, then validation) PP = 2 {got}\n       one process {ref}\nmax rel {dl:.1e}")
    assert len(ref) == len(got) > TRAIN_ARGS["max_steps"] and dl <= TOL
    _assert_same_model("PP = 2", pp2, one)

    ckpt = os.path.join(pp2, "checkpoint-2")
    _launch(2, str(tmp_path / "r"), TRAIN, cfg, *PP, "--output_dir", str(tmp_path / "pp2-pp2"),
            "--resume_from_checkpoint", ckpt)
    _run([sys.executable, os.path.join(ROOT, "tools", "train.py"), cfg, "--output_dir", str(tmp_path / "pp2-one"),
          "--resume_from_checkpoint", ckpt], str(tmp_path))
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
    model-parallel group): the one-process run's losses and validation loss, and the model/ of the same run at TP = 2
    without PP. (Against the one-process model/ the weights differ by up to ~3e-4 of the largest after 4 AdamW steps,
    as at TP = 2 alone: the all-reduce sums the partial products in another order, and AdamW's normalised step turns
    last-bit gradient differences into ~lr-sized ones; the losses still agree to 4e-7.)"""
    cfg, one = one_process
    out, tp2 = str(tmp_path / "pp2tp2"), str(tmp_path / "tp2")
    _launch(4, str(tmp_path), TRAIN, cfg, *PP, "--tensor_parallel_degree", "2", "--output_dir", out)
    got, ref = _losses(out), _losses(one)
    dl = max(abs(a - b) / abs(b) for a, b in zip(got, ref))
    print(f"losses (4 steps, then validation) PP = 2 x TP = 2 {got}\n       one process {ref}\nmax rel {dl:.1e}")
    assert len(ref) == len(got) > TRAIN_ARGS["max_steps"] and dl <= TOL
    _launch(2, str(tmp_path / "t"), TRAIN, cfg, "--tensor_parallel_degree", "2", "--vocab_parallel", "false",
            "--output_dir", tp2)  # pipeline stages keep the embedding and head whole
    _assert_same_model("PP = 2 x TP = 2 vs TP = 2", out, tp2)
