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
* PP = 2 and PP = 2 x TP = 2 through tools/train.py (PaddleFormers' Trainer): tests/test_pipeline_trainer.py.

The CPU shims (ParallelEnv's device id; one stage's no-recompute query; a barrier after each new_group for 4 gloo
ranks) are in tests/pp/ and tests/tp/train_shimmed.py, not in the product; launches go through tests/tp/launch.py
(docs/training.md, "Pipeline parallelism"). Printed errors are max |diff| / max |ref| (worst tensor named).
"""
from __future__ import annotations

import json
import os

import pytest

from tp.launch import launch, ok, run_once

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER = os.path.join(ROOT, "tests", "pp", "pp_worker.py")
CASES = ["vha", "vha-tied", "vha-shared-kv", "mea", "skv"]
TOL = 1e-5


def _launch(nproc: int, out_dir: str, script: str, *args: str) -> str:
    """script on nproc gloo ranks through tests/tp/launch.py (no retry: a failed launch fails the test)."""
    return ok(launch(script, *args, nproc=nproc, log_dir=os.path.join(out_dir, "log"), timeout=420)).output


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
    ok(run_once(WORKER, "--out", str(tmp_path), "--mode", "single", "--cases", ",".join(SINGLE_CASES), timeout=420))
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
