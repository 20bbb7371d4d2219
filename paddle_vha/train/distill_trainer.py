"""`DistillTrainer`: PaddleFormers' Trainer (through CheckpointTrainer) whose training loss is the distillation mix of
paddle_vha/train/distill.py against a frozen teacher (paddle_vha/train/teacher.py), each term logged.

`compute_loss` feeds the batch's input_ids to the student (with its labels: the model's own cross-entropy) and, under
no_grad, to the teacher; decoder-layer outputs are taken by forward post-hooks on both models' decoder layers (only
while a training loss is computed, and only when the hidden-state term has weight). Evaluation keeps the plain
cross-entropy, so eval_loss means the same with or without a teacher. Each log record gets the mean, over the steps
since the previous record (and over data-parallel ranks, as the Trainer's `loss`), of `ce`, `kd_kl`, `kd_hidden`, and
the KD weights at the last of those steps (`kd_kl_weight`, `kd_hidden_weight`). The schedule reads the Trainer's
global_step, which a resumed run restores from checkpoint-N: the same weights, the same losses as an uninterrupted run.
"""
from __future__ import annotations

from .distill import DistillSettings, hidden_term, kd_weight, kl_term, layer_map, mix
from .resume import CheckpointTrainer

__all__ = ["DistillSettings", "DistillTrainer", "decoder_layers"]

TERMS = ("ce", "kd_kl", "kd_hidden")


def decoder_layers(model):
    """The decoder layers of a family's causal LM (PaddleFormers' Qwen3 layout: model.model.layers)."""
    return list(model.model.layers)


class _Capture:
    """Forward post-hooks that keep each decoder layer's output while `on` is set."""

    def __init__(self, layers):
        self.on, self.outputs = False, {}
        self.handles = [layer.register_forward_post_hook(self._hook(i)) for i, layer in enumerate(layers)]

    def _hook(self, i):
        def hook(layer, inputs, output):
            if self.on:
                self.outputs[i] = output[0] if isinstance(output, (tuple, list)) else output
        return hook

    def take(self):
        out = [self.outputs[i] for i in sorted(self.outputs)]
        self.outputs = {}
        return out


class DistillTrainer(CheckpointTrainer):
    """The Trainer with a frozen `teacher` and `distill` (DistillSettings): see the module docstring."""

    def __init__(self, *args, teacher, distill: DistillSettings, **kwargs):
        super().__init__(*args, **kwargs)
        self.teacher, self.distill = teacher, distill
        self._sums, self._count, self._weights = None, 0, (0.0, 0.0)
        if distill.hidden_weight:
            self._map = layer_map(self.model.config.num_hidden_layers, teacher.config.num_hidden_layers)
            self._student_hidden = _Capture(decoder_layers(self.model))
            self._teacher_hidden = _Capture(decoder_layers(teacher))

    def compute_loss(self, model, inputs, return_outputs=False):
        if not model.training:  # evaluation / prediction: the plain cross-entropy
            return super().compute_loss(model, inputs, return_outputs=return_outputs)
        import paddle

        d = self.distill
        step = self.state.global_step  # optimizer steps done: the 0-based index of the step being computed
        w_kl = kd_weight(d.kl_weight, d.schedule, step, self.state.max_steps)
        w_hid = kd_weight(d.hidden_weight, d.schedule, step, self.state.max_steps)
        labels = inputs.get("labels")
        with self._capturing():
            outputs = model(**inputs, return_dict=True)
            with paddle.no_grad():
                teacher_logits = self.teacher(input_ids=inputs["input_ids"], return_dict=True).logits
            s_hidden, t_hidden = self._hidden()
        ce = outputs.loss
        kl = kl_term(outputs.logits, teacher_logits, d.temperature, labels)
        hidden = hidden_term(s_hidden, t_hidden, self._map, labels) if s_hidden else None
        loss = mix(ce, kl, hidden, d.ce_weight, w_kl, w_hid)
        self._record(ce, kl, hidden, (w_kl, w_hid))
        return (loss, outputs) if return_outputs else loss

    def _capturing(self):
        from contextlib import contextmanager

        @contextmanager
        def on():
            caps = [self._student_hidden, self._teacher_hidden] if self.distill.hidden_weight else []
            for c in caps:
                c.on = True
            try:
                yield
            finally:
                for c in caps:
                    c.on = False
        return on()

    def _hidden(self):
        if not self.distill.hidden_weight:
            return [], []
        return self._student_hidden.take(), self._teacher_hidden.take()

    def _record(self, ce, kl, hidden, weights) -> None:
        import paddle

        zero = paddle.zeros([], dtype="float32")
        values = paddle.stack([t.detach().astype("float32").reshape([]) if t is not None else zero
                               for t in (ce, kl, hidden)])  # [3]
        self._sums = values if self._sums is None else self._sums + values
        self._count += 1
        self._weights = weights

    def log(self, logs, **kwargs) -> None:
        if "loss" in logs and "eval_loss" not in logs and self._count:
            gathered = self._nested_gather(self._sums / self._count)  # every rank calls log here (a collective)
            means = gathered.reshape([-1, len(TERMS)]).mean(axis=0).numpy()
            logs.update({k: float(v) for k, v in zip(TERMS, means)})
            logs["kd_kl_weight"], logs["kd_hidden_weight"] = self._weights
            if not self.distill.hidden_weight:  # a term not computed is not logged
                del logs["kd_hidden"], logs["kd_hidden_weight"]
            self._sums, self._count = None, 0
        super().log(logs, **kwargs)
