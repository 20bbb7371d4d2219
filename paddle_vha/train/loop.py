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
    """train_lm's resumable state in `path` (one file, replaced atomically every `every` steps; remove() once the
    run's result is kept). Optimizer accumulators are stored under the parameters' structural names (Paddle's own
    parameter names depend on what else the process built first)."""

    def __init__(self, path: str, every: int):
        if every < 1:
            raise ValueError(f"checkpoint every {every} steps: must be >= 1")
        self.path, self.every = path, every

    @staticmethod
    def _renamer(model):
        names = sorted(((p.name, n) for n, p in model.named_parameters()), key=lambda t: -len(t[0]))
        return names

    def save(self, step: int, model, opt, losses, curve, seconds: float) -> None:
        import os

        import paddle

        names = self._renamer(model)
        state = {}
        for key, value in opt.state_dict().items():
            for pname, sname in names:
                if key.startswith(pname + "_"):
                    key = f"{sname}::{key[len(pname) + 1:]}"
                    break
            state[key] = value
        tmp = self.path + ".tmp"
        try:
            paddle.save(dict(step=step, model=model.state_dict(), opt=state, losses=list(losses), curve=list(curve),
                             seconds=seconds), tmp)
        except OSError as e:  # a full disk costs the run its resumability, not its result
            if os.path.exists(tmp):
                os.remove(tmp)
            print(f"warning: could not save {self.path} at step {step} ({e.strerror or e}); the run goes on",
                  file=sys.stderr, flush=True)
            return
        os.replace(tmp, self.path)

    def load(self, model, opt):
        """(step, losses, curve, seconds) of the saved state, restored into model and opt; None if none is saved."""
        import os

        import paddle

        if not os.path.isfile(self.path):
            return None
        saved = paddle.load(self.path)
        model.set_state_dict(saved["model"])
        back = {sname: pname for pname, sname in self._renamer(model)}
        state = {}
        for key, value in saved["opt"].items():
            sname, sep, rest = key.partition("::")
            state[f"{back[sname]}_{rest}" if sep else key] = value
        opt.set_state_dict(state)
        return saved["step"], saved["losses"], [tuple(c) for c in saved["curve"]], saved["seconds"]

    def remove(self) -> None:
        import os

        if os.path.isfile(self.path):
            os.remove(self.path)


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
