"""A minimal, deterministic training loop for small CPU runs (quick-start, the VHA-vs-GQA study).

Real training goes through PaddleFormers' Trainer (trainer.py, tools/train.py). This loop exists for runs of a few
hundred steps where the Trainer's set-up would dominate: AdamW, warm-up + cosine schedule, global-norm
clipping, next-byte cross-entropy, and a fixed validation set. With a `distiller` (paddle_vha/train/distiller.py: a
frozen teacher and DistillSettings) the training loss is the Trainer's distillation mix instead (the same code);
validation stays the plain cross-entropy.
"""
from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass, field
from typing import List, Optional

import numpy as np

__all__ = ["TrainSettings", "TrainResult", "train_lm", "evaluate_lm"]


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


def train_lm(model, corpus, s: TrainSettings, params: Optional[list] = None, distiller=None) -> TrainResult:
    """Train `model` (a causal LM returning .logits) on `corpus` (paddle_vha.train.corpus.ByteCorpus) in place;
    with `distiller` (a Distiller built on this model) the loss is its mix. TrainResult.losses are the
    cross-entropy either way."""
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
    losses, curve = [], []
    t0 = time.time()
    bar = tqdm(range(s.steps), desc=s.label, disable=not s.progress, leave=False, file=sys.stderr)
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
    seconds = time.time() - t0
    val = evaluate_lm(model, corpus, s)
    curve.append((s.steps, val))
    model.eval()
    return TrainResult(losses=losses, val_loss=val, seconds=seconds, val_curve=curve)
