"""The Trainer callback of tools/train.py: one log line per record (with the training tokens per second of the steps
since the last one), train_log.jsonl, checkpoint-N/model copies, and the stop on a NaN or Inf (loss, gradient norm,
validation loss or a parameter)."""
from __future__ import annotations

import json
import math
import os
import sys
import time

from .distill import TERM_WEIGHTS, TERMS
from .paddleformers_trainer import TrainerCallback

__all__ = ["TrainLog", "nonfinite_parameter"]


class TrainLog(TrainerCallback):
    """Prints each log record in one line and appends it to OUTPUT_DIR/train_log.jsonl (PaddleFormers 1.0.0 keeps no
    log history in trainer_state.json); on each save, writes checkpoint-N/model in the documented format (on every rank
when several run: the save is collective).

    A NaN or Inf loss, gradient norm or validation loss, or a parameter holding one (checked at every log step: with
    NaN weights PaddleFormers' loss can still read as a finite ln(vocab)), stops training at once (`nonfinite` says
    what and when): it is written to the log as null (strict JSON) and `run` stops with a one-line TrainError, saving
    nothing."""

    # every term of the loss and its weight are there when a teacher is (paddle_vha/train/distill_trainer.py): the
    # names come from the mix itself (distill.TERMS), so a term added to the loss is logged (a copied list here missed
    # kd_attn, and the logged loss stopped being the sum of the logged parts)
    KEYS = ("loss", "eval_loss", "learning_rate", "global_norm") + TERMS + TERM_WEIGHTS

    def __init__(self, model, path: str, save_model=None, tokens_per_step: int = 0):
        self.model, self.path, self.save_model = model, path, save_model  # save_model(dest), or None: no copies
        self.last = {}  # key -> (step, value) of the latest record
        self.nonfinite = None  # (what, step) of the first non-finite number seen
        self.steps_run = 0  # optimizer steps this process has run
        # training throughput: tokens of all ranks per optimizer step, and the wall time inside steps (forward,
        # backward, optimizer; evaluation and saving left out) since the last record
        self.tokens_per_step, self._busy, self._steps, self._t0 = tokens_per_step, 0.0, 0, None

    def on_step_begin(self, args, state, control, **kwargs):
        self._t0 = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        self.steps_run += 1
        if self._t0 is not None:
            self._busy += time.perf_counter() - self._t0
            self._steps += 1
            self._t0 = None

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not logs:
            return
        rec = {"step": state.global_step, **{k: float(logs[k]) for k in self.KEYS if k in logs}}
        if len(rec) == 1:
            return
        if "loss" in rec and self.tokens_per_step and self._busy > 0:  # a training record: the steps since the last
            rec["tokens_per_second"] = self._steps * self.tokens_per_step / self._busy
            self._busy, self._steps = 0.0, 0
        for k, v in rec.items():  # on every rank: main() decides from it whether to evaluate (a collective)
            if k != "step":
                self.last[k] = (rec["step"], v)
                if not math.isfinite(v) and self.nonfinite is None:
                    self.nonfinite = (f"{k} is {v}", rec["step"])
        if self.nonfinite is None:
            bad = nonfinite_parameter(self.model)  # every rank, at the same steps: the decision is collective
            if bad is not None:
                self.nonfinite = (f"parameter {bad} holds NaN or Inf", rec["step"])
        if self.nonfinite is not None:
            control.should_training_stop = True
            control.should_save = False
        if not state.is_world_process_zero:
            return
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        strict = {k: (v if math.isfinite(v) else None) for k, v in rec.items()}
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(strict, allow_nan=False) + "\n")
        print("  ".join([f"step {rec['step']}"] + [f"{k} {v:.4g}" for k, v in rec.items() if k != "step"]),
              file=sys.stderr)

    def on_save(self, args, state, control, **kwargs):
        if self.nonfinite is not None:
            return
        if self.save_model is None:
            return
        ckpt = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
        if args.world_size > 1:  # save_pretrained is collective (paddle_vha/train/saving.py): every rank calls it
            self.save_model(os.path.join(ckpt, "model"))
        elif args.should_save and os.path.isdir(ckpt):
            self.save_model(os.path.join(ckpt, "model"))


def nonfinite_parameter(model):
    """The name of the first parameter holding a NaN or Inf (on any rank: "a parameter on another rank"), or None.
    Collective when several processes run: call it on every rank at the same step."""
    import paddle
    import paddle.distributed as dist

    bad = next((name for name, p in model.named_parameters() if not bool(paddle.isfinite(p).all())), None)
    if dist.get_world_size() > 1:
        flag = paddle.to_tensor([0 if bad is None else 1], dtype="int32")
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if int(flag.numpy()[0]) and bad is None:
            bad = "on another rank"
    return bad
