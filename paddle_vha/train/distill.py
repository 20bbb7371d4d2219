"""The distillation loss of tools/train.py --teacher: its terms, their mix and the weight schedule (paddle tensors).

For student logits z_s, teacher logits z_t over V classes at the same N positions (the same tokens were fed to both),
temperature T, decoder-layer outputs h_s[l], h_t[m(l)] of width h, and attention-block outputs a_s[l], a_t[m(l)]
(each layer's o_proj output, before the residual add):

    kl     = T^2 * mean over positions of  KL(p_t || p_s),  p = softmax(z / T)       (forward KL: teacher -> student)
           = T^2 * mean_n  sum_v p_t[n, v] * (log p_t[n, v] - log p_s[n, v])
    hidden = mean over the mapped layers l of  mean over positions and features of (h_s[l] - h_t[m(l)])^2
    attn   = the same mean squared difference of a_s[l] and a_t[m(l)]
    loss   = w_ce * ce  +  w_kl(step) * kl  +  w_hidden(step) * hidden  +  w_attn(step) * attn

The T^2 factor (Hinton et al., 2015) keeps the gradient's size independent of T. `ce` is the student's own
cross-entropy against the labels (the model's loss, as without a teacher). Positions whose label is the ignore index
(< 0) are left out of every mean. The KD weights follow a schedule over optimizer steps: `constant`, or `linear`
(w * (1 - step / max_steps): full weight at the first step, 0 at the last). The layer map pairs student layer l with
teacher layer m(l): equal depths map l -> l; a teacher k times as deep maps l -> (l + 1) k - 1 (each student layer
to the last of its block of k teacher layers); other depths are refused.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Sequence

__all__ = ["DistillSettings", "SCHEDULES", "TERMS", "TERM_WEIGHTS", "kd_weight", "layer_map", "kl_term", "hidden_term",
           "mix"]

SCHEDULES = ("constant", "linear")
# every term of the mix as the log names it, and the KD terms' weights at a step (`mix`'s order): what the Trainer's
# log records and tools/train.py's train_log.jsonl / console keep (paddle_vha/train/callbacks.py reads these names)
TERMS = ("ce", "kd_kl", "kd_hidden", "kd_attn")
TERM_WEIGHTS = ("kd_kl_weight", "kd_hidden_weight", "kd_attn_weight")


@dataclass
class DistillSettings:
    """The mix's weights (w_ce, and the KD weights before the schedule), the temperature T and the schedule."""
    ce_weight: float = 1.0
    kl_weight: float = 1.0
    temperature: float = 1.0
    hidden_weight: float = 0.0
    schedule: str = "constant"
    attn_weight: float = 0.0

    def check(self) -> None:
        """ValueError (one line) for settings the mix cannot mean."""
        import math

        for name in ("ce_weight", "kl_weight", "hidden_weight", "attn_weight"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v >= 0):
                raise ValueError(f"distill_{name} must be a finite number >= 0, got {v}")
        if not (math.isfinite(self.temperature) and self.temperature > 0):
            raise ValueError(f"distill_temperature must be a finite number > 0, got {self.temperature}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"distill_schedule {self.schedule!r} is not one of {', '.join(SCHEDULES)}")
        if not (self.ce_weight or self.kl_weight or self.hidden_weight or self.attn_weight):
            raise ValueError("distill_ce_weight, distill_kl_weight, distill_hidden_weight and distill_attn_weight are "
                             "all 0: nothing to train")

    @property
    def layer_terms(self) -> tuple:
        """The arguments of the per-layer terms asked for (weight > 0): what a teacher's width and depth must fit."""
        return tuple(f"distill_{n}_weight" for n in ("hidden", "attn") if getattr(self, f"{n}_weight"))

    @property
    def needs_layers(self) -> bool:
        """Whether a term compares per-layer activations (equal widths and a layer map needed)."""
        return bool(self.hidden_weight or self.attn_weight)


def kd_weight(weight: float, schedule: str, step: int, max_steps: int) -> float:
    """A KD term's weight at optimizer step `step` (0-based: the step being computed) of `max_steps`."""
    if schedule == "constant" or weight == 0:
        return float(weight)
    if schedule == "linear":
        return float(weight) * max(0.0, 1.0 - step / max(1, max_steps))
    raise ValueError(f"distill_schedule {schedule!r} is not one of {', '.join(SCHEDULES)}")


def layer_map(student_layers: int, teacher_layers: int) -> List[int]:
    """m(l) for l = 0 .. student_layers - 1 (the module docstring); ValueError for depths it does not define."""
    if teacher_layers == student_layers:
        return list(range(student_layers))
    if teacher_layers > student_layers and teacher_layers % student_layers == 0:
        k = teacher_layers // student_layers
        return [(l + 1) * k - 1 for l in range(student_layers)]
    raise ValueError(f"hidden-state distillation maps student layers onto teacher layers when the depths are equal or "
                     f"the teacher's is a multiple of the student's; got {student_layers} student and {teacher_layers} "
                     "teacher layers (set distill_hidden_weight 0)")


def _mask(labels, shape_bn):
    """[B, S] float mask of the positions that count (label >= 0), or None for all."""
    if labels is None:
        return None
    return (labels.reshape(shape_bn) >= 0).astype("float32")


def kl_term(student_logits, teacher_logits, temperature: float, labels=None):
    """T^2 * mean KL(softmax(z_t / T) || softmax(z_s / T)) over the counted positions; logits [B, S, V]."""
    T = float(temperature)
    log_ps = _log_softmax(student_logits.astype("float32") / T)  # [B, S, V]
    log_pt = _log_softmax(teacher_logits.astype("float32") / T)
    per_pos = (log_pt.exp() * (log_pt - log_ps)).sum(axis=-1)  # [B, S]
    return T * T * _masked_mean(per_pos, _mask(labels, per_pos.shape))


def _log_softmax(z):
    """z - logsumexp(z) over the last axis. Paddle 3.3's CPU log_softmax kernel is pathologically slow over a large
    class axis (measured: 138 s for 8 rows of 151,936 classes, vs 1.7 s for 128 rows this way)."""
    import paddle

    return z - paddle.logsumexp(z, axis=-1, keepdim=True)


def hidden_term(student_hidden: Sequence, teacher_hidden: Sequence, mapping: Sequence[int], labels=None):
    """Mean over the mapped layers of the mean squared difference of per-layer activations ([B, S, h] each): the
    decoder-layer outputs (the hidden term) or the attention-block outputs (the attn term)."""
    terms = []
    for l, m in enumerate(mapping):
        diff = student_hidden[l].astype("float32") - teacher_hidden[m].astype("float32")
        per_pos = (diff * diff).mean(axis=-1)  # [B, S]
        terms.append(_masked_mean(per_pos, _mask(labels, per_pos.shape)))
    return sum(terms[1:], terms[0]) / len(terms)


def _masked_mean(per_pos, mask):
    if mask is None:
        return per_pos.mean()
    return (per_pos * mask).sum() / mask.sum().clip(min=1.0)


def mix(ce, kl, hidden, w_ce: float, w_kl: float, w_hidden: float, attn=None, w_attn: float = 0.0):
    """w_ce ce + w_kl kl + w_hidden hidden + w_attn attn, leaving out the terms whose weight is 0 (which may then be
    None)."""
    total = ce * w_ce
    for term, w in ((kl, w_kl), (hidden, w_hidden), (attn, w_attn)):
        if w:
            total = total + term * w
    return total
