"""`Distiller`: a frozen teacher, the distillation settings and the activation hooks on both models; the one place
the distillation mix of distill.py is computed for a training step (DistillTrainer.compute_loss, the small loop's
train_lm(teacher=...)).

The student is run by the caller (its own forward, returning its cross-entropy and logits) inside the hooks' window;
the teacher is run here under no_grad on the same input_ids. The hidden term hooks each decoder layer, the attn term
each layer's attention block (its o_proj output); a term whose weight is 0 installs no hook and computes nothing.
`StoredDistiller` is the same step against a stored teacher's outputs carried by the batch (no teacher runs).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from .capture import Capture, attention_blocks, capturing, decoder_layers
from .distill import DistillSettings, hidden_term, kd_weight, kl_term, layer_map, mix

__all__ = ["Distiller", "StoredDistiller", "StepLoss", "STORED_KEYS"]


@dataclass
class StepLoss:
    loss: Any  # the mix (a scalar tensor with the student's graph)
    ce: Any
    kl: Any
    hidden: Optional[Any]
    attn: Optional[Any]
    weights: tuple  # (w_kl, w_hidden, w_attn) at this step
    outputs: Any  # what the student's forward returned


class Distiller:
    def __init__(self, student, teacher, settings: DistillSettings):
        self.teacher, self.settings = teacher, settings
        s_cfg, t_cfg = student.config, teacher.config
        self.map = layer_map(s_cfg.num_hidden_layers, t_cfg.num_hidden_layers) if settings.needs_layers else None
        self.hidden = ((Capture(decoder_layers(student)), Capture(decoder_layers(teacher)))
                       if settings.hidden_weight else None)
        self.attn = ((Capture(attention_blocks(student)), Capture(attention_blocks(teacher)))
                     if settings.attn_weight else None)

    def step(self, run_student, input_ids, labels, step: int, max_steps: int) -> StepLoss:
        """The mix for optimizer step `step` (0-based) of `max_steps`. run_student() -> (ce, logits, outputs) runs the
        student's forward; labels [B, S] (< 0: position not counted) or None (all counted)."""
        import paddle

        d = self.settings
        weights = tuple(kd_weight(w, d.schedule, step, max_steps) for w in (d.kl_weight, d.hidden_weight, d.attn_weight))
        pairs = [p for p in (self.hidden, self.attn) if p is not None]
        with capturing([c for p in pairs for c in p]):
            ce, logits, outputs = run_student()
            with paddle.no_grad():
                teacher_logits = self.teacher(input_ids=input_ids, return_dict=True).logits
        kl = kl_term(logits, teacher_logits, d.temperature, labels)
        hidden = self._term(self.hidden, labels)
        attn = self._term(self.attn, labels)
        loss = mix(ce, kl, hidden, d.ce_weight, weights[0], weights[1], attn=attn, w_attn=weights[2])
        return StepLoss(loss, ce, kl, hidden, attn, weights, outputs)

    def _term(self, pair, labels):
        if pair is None:
            return None
        student, teacher = pair[0].take(), pair[1].take()
        return hidden_term(student, teacher, self.map, labels)

    def close(self) -> None:
        """Remove the hooks (the models are usable without a teacher afterwards)."""
        for pair in (self.hidden, self.attn):
            for c in pair or ():
                c.remove()


STORED_KEYS = ("teacher_ids", "teacher_logp", "teacher_rest")  # what a stored teacher's samples add (TeacherWindows)


class StoredDistiller:
    """The mix against a stored teacher (paddle_vha/train/stored_teacher.py): the KL term is stored_kl over the
    batch's stored top-K and remainder; no teacher runs, no hooks (the per-layer terms need a live teacher)."""

    def __init__(self, settings: DistillSettings):
        assert not settings.needs_layers, "a stored teacher holds logits only"
        self.settings = settings

    def step(self, run_student, stored, labels, step: int, max_steps: int) -> StepLoss:
        """stored: (teacher_ids (B, S, K) int64, teacher_logp (B, S, K), teacher_rest (B, S)) of the batch."""
        from .stored_teacher import stored_kl

        d = self.settings
        weights = tuple(kd_weight(w, d.schedule, step, max_steps) for w in (d.kl_weight, d.hidden_weight, d.attn_weight))
        ce, logits, outputs = run_student()
        kl = stored_kl(logits, *stored, labels=labels)
        loss = mix(ce, kl, None, d.ce_weight, weights[0], 0.0)
        return StepLoss(loss, ce, kl, None, None, weights, outputs)

    def close(self) -> None:
        pass
