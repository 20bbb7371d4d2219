"""A minimal, deterministic training loop for small CPU runs (quick-start, the VHA-vs-GQA study).

Real training goes through PaddleFormers' Trainer (trainer.py, tools/train.py). This loop exists for runs of a few
hundred steps where the Trainer's set-up would dominate: AdamW, warm-up + cosine schedule, global-norm
clipping, next-byte cross-entropy, and a fixed validation set. With a `distiller` (paddle_vha/train/distiller.py: a
frozen teacher and DistillSettings) the training loss is the Trainer's distillation mix instead (the same code);
validation stays the plain cross-entropy. With a `resume` (LoopCheckpoint) the run saves its state every `every`
steps and a killed run restarted with the same settings continues from the last save: the same batches (the data RNG
is advanced past the steps done), the optimizer's moments, the schedule's position, the losses and the curve so far.
"""
from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass, field
from typing import List, Optional

import numpy as np

__all__ = ["TrainSettings", "TrainResult", "train_lm", "evaluate_lm", "LoopCheckpoint"]


@dataclass
class TrainSettings:
    steps: int = 40
    batch_size: int = 8
    seq_len: int = 128
    lr: float = 3e-3
    warmup: int = 5
    weight_decay: float = 0.01
    clip: float = 1.0
    data_seed: int = 0  # batch order: the same for every model trained with these settings
    val_batches: int = 8
    eval_every: int = 0  # 0: evaluate only at the end
    progress: bool = True
    label: str = "train"
    schedule: str = "cosine"  # "cosine": linear warm-up then cosine decay to 0; "constant": warm-up then a fixed rate


@dataclass
class TrainResult:
    losses: List[float]
    val_loss: float
    seconds: float
    val_curve: List[tuple] = field(default_factory=list)  # (step, val loss)
    diverged_at: Optional[int] = None  # the step whose training loss was NaN or Inf (training stopped there)

    @property
    def first(self) -> float:
        return float(np.mean(self.losses[:3]))

    @property
    def last(self) -> float:
        return float(np.mean(self.losses[-3:]))


def _xent(model, x, y, check_finite: bool = False):
    import paddle

    loss, logits = _xent_logits(model, paddle.to_tensor(x), y)
    if check_finite:  # Paddle's CPU cross-entropy returns ln(V), not NaN, for NaN / Inf logits: look at the logits
        return loss, bool(paddle.isfinite(logits).all())
    return loss


def _xent_logits(model, ids, y):
    import paddle
    import paddle.nn.functional as F

    logits = model(ids, return_dict=True).logits  # (B, S, V)
    return F.cross_entropy(logits.reshape([-1, logits.shape[-1]]), paddle.to_tensor(y).reshape([-1])), logits


def _train_loss(model, x, y, distiller, step: int, steps: int):
    """(loss to minimise, its cross-entropy part as a float, finite?) for one batch; the KD mix with a distiller."""
    import paddle

    if distiller is None:
        loss, finite = _xent(model, x, y, check_finite=True)
        return loss, float(loss), finite
    ids = paddle.to_tensor(x)

    def run_student():
        ce, logits = _xent_logits(model, ids, y)
        return ce, logits, logits

    r = distiller.step(run_student, ids, None, step, steps)  # every position counts (no ignored labels here)
    return r.loss, float(r.ce), bool(paddle.isfinite(r.outputs).all()) and math.isfinite(float(r.loss))


def evaluate_lm(model, corpus, s: TrainSettings) -> float:
    import paddle

    was_training = model.training
    model.eval()
    with paddle.no_grad():
        val = [float(_xent(model, x, y)) for x, y in corpus.val_batches(s.batch_size, s.seq_len, s.val_batches)]
    if was_training:
        model.train()
    return float(np.mean(val))


class LoopCheckpoint:
    """train_lm's resumable state in the folder `path` (replaced atomically every `every` steps; remove() once the
    run's result is kept): meta.json (step, losses, curve, seconds, the schedule's state) and one .npy per tensor,
    written one tensor at a time (a whole-state pickle doubled the process's memory while saving). Optimizer
    accumulators are stored under the parameters' structural names (Paddle's own parameter names depend on what else
    the process built first)."""

    def __init__(self, path: str, every: int):
        if every < 1:
            raise ValueError(f"checkpoint every {every} steps: must be >= 1")
        self.path, self.every = path, every

    @staticmethod
    def _renamer(model):
        return sorted(((p.name, n) for n, p in model.named_parameters()), key=lambda t: -len(t[0]))

    def save(self, step: int, model, opt, losses, curve, seconds: float) -> None:
        import json
        import os
        import shutil

        import paddle

        names = self._renamer(model)
        tensors, extra = [], {}
        for key, value in model.state_dict().items():
            tensors.append(("model", key, value))
        for key, value in opt.state_dict().items():
            if not isinstance(value, paddle.Tensor):
                extra[key] = value  # LR_Scheduler: plain numbers
                continue
            for pname, sname in names:
                if key.startswith(pname + "_"):
                    key = f"{sname}::{key[len(pname) + 1:]}"
                    break
            tensors.append(("opt", key, value))
        tmp = self.path + ".tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            os.makedirs(tmp)
            for i, (_, _, value) in enumerate(tensors):
                np.save(os.path.join(tmp, f"{i}.npy"), value.numpy())
            with open(os.path.join(tmp, "meta.json"), "w") as f:
                json.dump(dict(step=step, losses=list(losses), curve=[list(c) for c in curve], seconds=seconds,
                               opt_extra=extra, tensors=[[kind, key] for kind, key, _ in tensors]), f)
        except (OSError, TypeError) as e:  # a full disk costs the run its resumability, not its result
            shutil.rmtree(tmp, ignore_errors=True)
            print(f"warning: could not save {self.path} at step {step} ({getattr(e, 'strerror', None) or e}); the "
                  "run goes on", file=sys.stderr, flush=True)
            return
        self.remove()
        os.replace(tmp, self.path)

    def load(self, model, opt):
        """(step, losses, curve, seconds) of the saved state, restored into model and opt; None if none is saved."""
        import json
        import os

        import paddle

        if not os.path.isdir(self.path):
            return None
        with open(os.path.join(self.path, "meta.json")) as f:
            meta = json.load(f)
        back = {sname: pname for pname, sname in self._renamer(model)}
        model_state, opt_state = {}, dict(meta["opt_extra"])
        for i, (kind, key) in enumerate(meta["tensors"]):
            value = np.load(os.path.join(self.path, f"{i}.npy"))
            if kind == "model":
                model_state[key] = value
            else:
                sname, sep, rest = key.partition("::")
                opt_state[f"{back[sname]}_{rest}" if sep else key] = paddle.to_tensor(value)
        model.set_state_dict(model_state)
        del model_state
        opt.set_state_dict(opt_state)
        return meta["step"], meta["losses"], [tuple(c) for c in meta["curve"]], meta["seconds"]

    def remove(self) -> None:
        import os
        import shutil

        shutil.rmtree(self.path, ignore_errors=True)


def train_lm(model, corpus, s: TrainSettings, params: Optional[list] = None, distiller=None,
             resume: Optional[LoopCheckpoint] = None) -> TrainResult:
    """Train `model` (a causal LM returning .logits) on `corpus` (paddle_vha.train.corpus.ByteCorpus) in place;
    with `distiller` (a Distiller built on this model) the loss is its mix. TrainResult.losses are the
    cross-entropy either way. With `resume`, continue from its saved state if any and save every resume.every steps
    (TrainResult.seconds then sums every process's training time)."""
    import paddle
    from tqdm import tqdm

    rng = np.random.default_rng(s.data_seed)
    if s.schedule not in ("cosine", "constant"):
        raise ValueError(f"schedule {s.schedule!r}: expected 'cosine' or 'constant'")
    decay = (lambda k: 0.5 * (1 + math.cos(math.pi * k / s.steps))) if s.schedule == "cosine" else (lambda k: 1.0)
    schedule = lambda k: min(1.0, (k + 1) / max(s.warmup, 1)) * decay(k)  # noqa: E731
    sched = paddle.optimizer.lr.LambdaDecay(s.lr, schedule)
    params = params if params is not None else [p for p in model.parameters() if not p.stop_gradient]
    opt = paddle.optimizer.AdamW(sched, parameters=params, weight_decay=s.weight_decay,
                                 grad_clip=paddle.nn.ClipGradByGlobalNorm(s.clip))
    model.train()
    losses, curve, start, before = [], [], 0, 0.0
    if resume is not None:
        saved = resume.load(model, opt)
        if saved is not None:
            start, losses, curve, before = saved
            for _ in range(start):  # the batches the saved steps took
                corpus.batch(rng, s.batch_size, s.seq_len)
            model.train()
    t0 = time.time() - before
    bar = tqdm(range(start, s.steps), desc=s.label, disable=not s.progress, leave=False, file=sys.stderr,
               initial=start, total=s.steps)
    for step in bar:
        x, y = corpus.batch(rng, s.batch_size, s.seq_len)
        loss, ce, finite = _train_loss(model, x, y, distiller, step, s.steps)
        if not (finite and math.isfinite(ce)):  # diverged: stop here, never report a number for it
            losses.append(float("nan"))
            bar.close()
            model.eval()
            return TrainResult(losses=losses, val_loss=float("nan"), seconds=time.time() - t0, val_curve=curve,
                               diverged_at=step)
        loss.backward()
        opt.step()
        opt.clear_grad()
        sched.step()
        losses.append(ce)
        bar.set_postfix(loss=f"{losses[-1]:.3f}")
        if s.eval_every and (step + 1) % s.eval_every == 0 and step + 1 < s.steps:
            curve.append((step + 1, evaluate_lm(model, corpus, s)))
        if resume is not None and (step + 1) % resume.every == 0 and step + 1 < s.steps:
            resume.save(step + 1, model, opt, losses, curve, time.time() - t0)
            model.train()
    seconds = time.time() - t0
    val = evaluate_lm(model, corpus, s)
    curve.append((s.steps, val))
    model.eval()
    return TrainResult(losses=losses, val_loss=val, seconds=seconds, val_curve=curve)
