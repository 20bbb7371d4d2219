"""The frozen teacher of a distillation run (tools/train.py --teacher PATH): any family the registry knows, checked
against the student, loaded in float32 and frozen.

Frozen means: every parameter has stop_gradient set (no gradient is computed for it), the model is in eval mode, it
is not an attribute of the student (so the optimizer, which takes the student's parameters, holds no state for it,
and no checkpoint-N or saved model contains it), and the RNG state is the same before and after it is built (the
student's initialisation and data order do not depend on whether a teacher is loaded).

Under tensor parallelism every rank holds the whole teacher (replicated): the student's plan keeps the hidden states
and the logits whole on every rank (row-parallel closes each block with an all-reduce; the vocabulary-parallel head
all-gathers its logits, tensor_parallel_output off for a distillation run), so
each rank computes the same teacher outputs for the same tokens with no collective, and any family loads the same way
(docs/training.md, "Distillation").
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from ..checkpoint.contract import CheckpointError
from ..checkpoint.folder import CheckpointFolder
from ..families import UnknownFamily, family_of
from .errors import TrainError

__all__ = ["teacher_config", "load_teacher", "freeze", "distill_plan", "DistillPlan"]


def teacher_config(path: str, student_config, layer_terms=()):
    """(family, typed config) of the teacher folder; one-line TrainError for a folder that is missing or not a
    checkpoint, an unknown family, or a teacher the student cannot be distilled from (another vocabulary; for the
    per-layer terms, `layer_terms`: the weights set of distill_hidden_weight / distill_attn_weight, another width or
    a depth without a layer map; the refusal names the weights that ask for them)."""
    from .distill import layer_map

    if not os.path.isdir(path):
        raise TrainError(f"teacher {path}: no such folder")
    try:
        ck = CheckpointFolder.open(path)
        fam = family_of(ck)
        cfg = fam.validate(ck)
    except UnknownFamily as e:
        raise TrainError(f"teacher {e}") from None
    except (CheckpointError, ValueError, OSError) as e:
        raise TrainError(f"teacher {path}: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    if cfg.vocab_size != student_config.vocab_size:
        raise TrainError(f"teacher {path}: vocab_size {cfg.vocab_size} differs from the student's "
                         f"{student_config.vocab_size} (the logit KL needs the same vocabulary)")
    if layer_terms:
        names = " and ".join(layer_terms)
        if cfg.hidden_size != student_config.hidden_size:
            raise TrainError(f"teacher {path}: hidden_size {cfg.hidden_size} differs from the student's "
                             f"{student_config.hidden_size} ({names} compare layer outputs of equal width; set "
                             f"{names} 0)")
        try:
            layer_map(student_config.num_hidden_layers, cfg.num_hidden_layers)
        except ValueError as e:
            raise TrainError(f"teacher {path}: {e} (for {names}; set it 0 to distil the logits only)") from None
    return fam, cfg


def freeze(model):
    """stop_gradient on every parameter and eval mode; returns the model."""
    for p in model.parameters():
        p.stop_gradient = True
    model.eval()
    return model


def load_teacher(path: str, fam, cfg):
    """The teacher model holding the folder's weights (float32; the folder was checked against its family's contract
    by teacher_config), frozen. The global RNG state is restored afterwards."""
    import paddle

    from ..checkpoint.load import load_tensors_into

    state = paddle.get_rng_state()
    try:
        cfg.dtype = "float32"
        model = fam.model_class(cfg)
        load_tensors_into(model, CheckpointFolder.open(path).read_all(float32=True), source=path)
    except CheckpointError as e:
        raise TrainError(f"teacher {path}: {e}") from None
    finally:
        paddle.set_rng_state(state)
    return freeze(model)


@dataclass(frozen=True)
class DistillPlan:
    """A distillation run's teacher, resolved once: a checkpoint folder run online (family, config), or a stored
    teacher (store: paddle_vha/train/stored_teacher.py, whose windows are then the training data), and the mix."""
    path: str
    settings: object  # DistillSettings
    family: object = None
    config: object = None
    store: object = None

    @property
    def stored(self) -> bool:
        return self.store is not None

    def line(self) -> str:
        """What the run prints about its teacher and loss."""
        s = self.settings
        mix = f"{s.ce_weight:g} ce + {s.kl_weight:g} T^2 KL(teacher || student) at T={s.temperature:g}"
        if s.hidden_weight:
            mix += f" + {s.hidden_weight:g} hidden-state MSE"
        if s.attn_weight:
            mix += f" + {s.attn_weight:g} attention-output MSE"
        if self.stored:
            m = self.store.meta
            return (f"distill: stored teacher {self.path} (top-{m['k']} log-probabilities and the rest's mass of "
                    f"{m['teacher']} on {m['windows']:,} windows of {m['seq_len']}: the student runs alone); loss "
                    f"{mix} over the top-{m['k']} + rest; KD weights {s.schedule}")
        fam, cfg = self.family, self.config
        return (f"distill: teacher {self.path} ({fam.label}, {cfg.num_hidden_layers} layers, {cfg.num_attention_heads} "
                f"query / {cfg.num_key_value_heads} KV heads; frozen, float32, replicated on every rank); loss {mix}; "
                f"KD weights {s.schedule}")


def distill_plan(training_args, student_config, data_args=None):
    """None without --teacher; else a DistillPlan, checked in one line each (TrainError) before anything is built: the
    settings, the layouts distillation runs under, the teacher folder or stored teacher (and, for a store, that the
    run's data and window length are the store's)."""
    from .distill import DistillSettings
    from .stored_teacher import StoreError, TeacherStore, is_store

    path = training_args.teacher
    if not path:
        return None
    a = training_args
    settings = DistillSettings(ce_weight=a.distill_ce_weight, kl_weight=a.distill_kl_weight,
                               temperature=a.distill_temperature, hidden_weight=a.distill_hidden_weight,
                               schedule=a.distill_schedule, attn_weight=a.distill_attn_weight)
    try:
        settings.check()
    except ValueError as e:
        raise TrainError(str(e)) from None
    if a.pipeline_model_parallel_size > 1:
        raise TrainError("teacher with pipeline_model_parallel_size > 1 is not supported (the pipeline schedule "
                         "computes its own loss); use tensor or data parallelism")
    if settings.needs_layers and a.recompute_granularity:
        raise TrainError("distill_hidden_weight or distill_attn_weight > 0 with recompute_granularity: recomputed "
                         "decoder layers do not expose their outputs to the loss; turn recompute off or set them 0")
    if is_store(path):
        try:
            store = TeacherStore(path)
            check_store_run(store, settings, student_config, data_args)
        except StoreError as e:
            raise TrainError(f"teacher {e}") from None
        return DistillPlan(path, settings, store=store)
    fam, cfg = teacher_config(path, student_config, layer_terms=settings.layer_terms)
    return DistillPlan(path, settings, family=fam, config=cfg)


def check_store_run(store, settings, student_config, data_args) -> None:
    """StoreError (one line) for a stored teacher the run cannot use."""
    from .stored_teacher import StoreError

    if settings.needs_layers:
        raise StoreError(f"{store.path}: a stored teacher holds logits only; set {' and '.join(settings.layer_terms)} "
                         "0, or give the teacher checkpoint")
    if settings.temperature != 1.0:
        raise StoreError(f"{store.path}: stored at temperature 1 (its top-k and remainder cannot be re-tempered); set "
                         "distill_temperature 1, or give the teacher checkpoint")
    if store.meta.get("vocab_size") not in (None, student_config.vocab_size):
        raise StoreError(f"{store.path}: the teacher's vocab_size {store.meta['vocab_size']} differs from the "
                         f"student's {student_config.vocab_size}")
    if data_args is None:
        return
    if data_args.dataset != "pretrain":
        raise StoreError(f"{store.path}: a stored teacher brings its data ({store.data_prefix}); set dataset pretrain "
                         "(input_dir may be left out)")
    store.check_data(data_args.input_dir or None)
    if data_args.max_seq_len != store.seq_len:
        raise StoreError(f"{store.path}: stored on windows of {store.seq_len} tokens; set max_seq_len "
                         f"{store.seq_len} (not {data_args.max_seq_len})")
