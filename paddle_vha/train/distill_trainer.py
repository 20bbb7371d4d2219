"""`DistillTrainer`: PaddleFormers' Trainer (through CheckpointTrainer) whose training loss is the distillation mix of
paddle_vha/train/distill.py against a frozen teacher (paddle_vha/train/teacher.py) or a stored teacher's outputs
carried by the batches (paddle_vha/train/stored_teacher.py: the student runs alone), each term logged.

`compute_loss` feeds the batch's input_ids to the student (with its labels: the model's own cross-entropy) and, under
no_grad, to the teacher (paddle_vha/train/distiller.py, shared with the small loop); decoder-layer and attention-block
outputs are taken by forward post-hooks on both models (only while a training loss is computed, and only for a term
with weight). Evaluation keeps the plain cross-entropy, so eval_loss means the same with or without a teacher. Each
log record gets the mean, over the steps since the previous record (and over data-parallel ranks, as the Trainer's
`loss`), of `ce`, `kd_kl`, `kd_hidden`, `kd_attn`, and the KD weights at the last of those steps (`kd_kl_weight`,
`kd_hidden_weight`, `kd_attn_weight`); a term with weight 0 is not logged. The schedule reads the Trainer's
global_step, which a resumed run restores from checkpoint-N: the same weights, the same losses as an uninterrupted run.
"""
from __future__ import annotations

from .capture import decoder_layers
from .distill import TERM_WEIGHTS, TERMS, DistillSettings
from .distiller import STORED_KEYS, Distiller, StoredDistiller
from .resume import CheckpointTrainer

__all__ = ["DistillSettings", "DistillTrainer", "decoder_layers"]


class DistillTrainer(CheckpointTrainer):
    """The Trainer with a frozen `teacher` (a model; None for a stored teacher, whose outputs the batches carry) and
    `distill` (DistillSettings): see the module docstring."""

    def __init__(self, *args, teacher, distill: DistillSettings, **kwargs):
        super().__init__(*args, **kwargs)
        self.teacher, self.distill = teacher, distill
        self._sums, self._count, self._weights = None, 0, (0.0, 0.0, 0.0)
        self._distiller = Distiller(self.model, teacher, distill) if teacher is not None else StoredDistiller(distill)

    def compute_loss(self, model, inputs, return_outputs=False):
        stored = tuple(inputs.pop(k) for k in STORED_KEYS) if STORED_KEYS[0] in inputs else None
        if not model.training:  # evaluation / prediction: the plain cross-entropy
            return super().compute_loss(model, inputs, return_outputs=return_outputs)

        def run_student():
            outputs = model(**inputs, return_dict=True)
            return outputs.loss, outputs.logits, outputs

        # step: optimizer steps done, the 0-based index of the step being computed
        if self.teacher is None:
            if stored is None:
                raise ValueError("a stored-teacher run got a batch without teacher_ids / teacher_logp / teacher_rest")
            r = self._distiller.step(run_student, stored, inputs.get("labels"), self.state.global_step,
                                     self.state.max_steps)
        else:
            r = self._distiller.step(run_student, inputs["input_ids"], inputs.get("labels"), self.state.global_step,
                                     self.state.max_steps)
        self._record(r.ce, r.kl, r.hidden, r.attn, r.weights)
        return (r.loss, r.outputs) if return_outputs else r.loss

    def _record(self, ce, kl, hidden, attn, weights) -> None:
        import paddle

        zero = paddle.zeros([], dtype="float32")
        values = paddle.stack([t.detach().astype("float32").reshape([]) if t is not None else zero
                               for t in (ce, kl, hidden, attn)])  # [4]
        self._sums = values if self._sums is None else self._sums + values
        self._count += 1
        self._weights = weights

    def log(self, logs, **kwargs) -> None:
        if "loss" in logs and "eval_loss" not in logs and self._count:
            gathered = self._nested_gather(self._sums / self._count)  # every rank calls log here (a collective)
            means = gathered.reshape([-1, len(TERMS)]).mean(axis=0).numpy()
            logs.update({k: float(v) for k, v in zip(TERMS, means)})
            logs.update(zip(TERM_WEIGHTS, self._weights))
            for term, w in (("kd_hidden", self.distill.hidden_weight), ("kd_attn", self.distill.attn_weight)):
                if not w:  # a term not computed is not logged
                    del logs[term], logs[term + "_weight"]
            self._sums, self._count = None, 0
        super().log(logs, **kwargs)
