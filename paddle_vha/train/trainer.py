"""PaddleFormers' Trainer for any registered family: plan, build, train, evaluate and save one run (the glue behind
tools/train.py).

The arguments come from the trainer config (paddle_vha/train/arguments.py). `plan_run` resolves everything once, in
order, before anything is built, into a RunPlan that is then passed forward; each part lives in a file of its own:

    run_checks.py    arguments that cannot mean what the user wants, the device, the machine's memory
    run_model.py     what the run trains (RunModel: the family asked from the registry once, its checked config, the
                     tensor-parallel degree and whether paddle_vha.parallel shards it)
    teacher.py       the teacher, if any (DistillPlan: a checkpoint run online, or a stored teacher)
    run_data.py      the datasets (a stored teacher's windows, when the teacher is stored)
    model_build.py   the model, in its compute dtype, single-device / sharded / a pipeline stage
    fit.py           trainer.train (resumed where the output folder says) and the validation loss
    run_save.py      OUTPUT_DIR/model in the documented checkpoint format

The model is written to OUTPUT_DIR/model (and each checkpoint-N/model, paddle_vha/train/callbacks.py). Guide:
docs/training.md. Errors about the user's config, inputs or a run that cannot go on are one-line TrainErrors
(paddle_vha/train/errors.py); paddle_vha/cli/train.py prints them and exits with status 2.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Optional

from .arguments import tensor_parallel_degree
from .callbacks import TrainLog
from .fit import evaluate, quiet_checkpoint_io, resume_point, train_model
from .model_build import build_model
from .paddleformers_trainer import set_seed
from .resume import CheckpointTrainer
from .run_checks import check_arguments, check_device, check_memory
from .run_data import build_data, check_data_fits
from .run_lock import LOCK_FILE, hold_run_lock
from .run_model import RunModel, build_config, describe
from .run_save import model_saver, save_trained_model
from .teacher import DistillPlan, distill_plan, load_teacher
from .trainable import apply_trainable
from .errors import TrainError

__all__ = ["run", "RunPlan", "plan_run", "make_trainer"]


@dataclass(frozen=True)
class RunPlan:
    """One run, resolved before anything is built: its arguments, what it trains, its teacher, its data and the
    memory it needs. Built once by plan_run and passed forward."""

    model_args: Any
    data_args: Any
    training_args: Any
    model: RunModel
    distill: Optional[DistillPlan]
    train: Any  # the training dataset
    val: Any  # the validation dataset
    data_desc: str
    memory_line: str

    @property
    def sharded(self) -> bool:
        """Model parallelism: each rank holds a slice of the weights (no rank-0 save of the whole model)."""
        a = self.training_args
        return max(a.tensor_model_parallel_size, a.pipeline_model_parallel_size) > 1

    def print(self) -> None:
        """The model, data, parallel, teacher and memory lines printed before training (and by a dry run)."""
        a, d = self.training_args, self.data_args
        print(describe(self.model.config, d, a))
        print(f"data: {self.data_desc}; {len(self.train):,} train samples of {d.max_seq_len} tokens, "
              f"{len(self.val):,} validation samples")
        tp = self.model.tp
        if tp > 1:
            how = " (sharded by paddle_vha.parallel)" if self.model.plan_tp else ""
            print(f"parallel: tensor_model_parallel_size={tp}{how}; launch with python -m paddle.distributed.launch "
                  f"--nproc_per_node N tools/train.py ..., N a multiple of {tp}")
        if self.distill is not None:
            print(self.distill.line())
        print(self.memory_line)


def plan_run(model_args, data_args, training_args, requested: dict) -> RunPlan:
    """Every check and choice of the run, in order, each refusal one TrainError line; nothing built yet."""
    check_arguments(model_args, data_args, training_args)
    # The datasets shuffle themselves with a seeded permutation (as PaddleFormers' pretraining data does), so a
    # resumed run, which skips the batches already consumed, sees the same batches as an uninterrupted one.
    training_args.dataloader_shuffle = False
    tp = tensor_parallel_degree(requested, training_args)
    run_model = build_config(model_args, data_args, training_args, tp)  # the registry asked once, here
    config = run_model.config
    distill = distill_plan(training_args, config, data_args)  # None, or the teacher (online or stored)
    check_data_fits(model_args, data_args, config)
    store = distill.store if distill is not None else None
    train, val, data_desc = build_data(data_args, training_args, config.vocab_size, store=store)
    teacher_config = distill.config if distill is not None and not distill.stored else None
    memory_line = check_memory(config, data_args, training_args, tp, refuse=not training_args.dry_run,
                               teacher=teacher_config)
    return RunPlan(model_args, data_args, training_args, run_model, distill, train, val, data_desc, memory_line)


def run(model_args, data_args, training_args, requested: dict) -> int:
    """Build, train, evaluate and save as the arguments say; returns the exit status (TrainError, one line, for a run
    refused or stopped). A run that fails leaves no empty output folder behind."""
    out, existed = training_args.output_dir, os.path.exists(training_args.output_dir)
    try:
        return _run(model_args, data_args, training_args, requested)
    except BaseException:
        if not existed and os.path.isdir(out) and set(os.listdir(out)) <= {LOCK_FILE}:
            if os.path.exists(os.path.join(out, LOCK_FILE)):
                os.remove(os.path.join(out, LOCK_FILE))
            os.rmdir(out)
        raise


def _run(model_args, data_args, training_args, requested: dict) -> int:
    plan = plan_run(model_args, data_args, training_args, requested)
    plan.print()
    if training_args.dry_run:
        print("dry run: configuration is valid; nothing trained")
        return 0
    check_device(training_args)
    lock = hold_run_lock(training_args.output_dir)  # noqa: F841 - held until this function returns
    quiet_checkpoint_io()
    resume = resume_point(training_args)
    set_seed(training_args.seed)
    model = build_model(plan.model.model_cls, plan.model.config, model_args, training_args, plan.model.plan_tp)
    if training_args.train_only != "all" or training_args.freeze_embeddings:
        try:
            n, total = apply_trainable(model, training_args.train_only, training_args.freeze_embeddings)
        except ValueError as e:
            raise TrainError(str(e)) from None
        print(f"trainable: {n:,} of {total:,} weights (train_only {training_args.train_only}"
              f"{', embeddings frozen' if training_args.freeze_embeddings else ''})")
    # With tensor / pipeline parallelism each rank holds a slice of the weights, so a rank-0 save_pretrained would
    # write a partial model: the checkpoint-N/model copies are skipped and the final model goes through the Trainer.
    save = model_saver(model, model_args)
    a = training_args
    tokens_per_step = (a.per_device_train_batch_size * a.gradient_accumulation_steps * max(1, a.dataset_world_size)
                       * data_args.max_seq_len)
    log = TrainLog(model, os.path.join(training_args.output_dir, "train_log.jsonl"),
                   save if training_args.save_model_in_checkpoints and not plan.sharded else None, tokens_per_step)
    trainer = make_trainer(model, plan, log)
    if training_args.do_train:
        train_model(trainer, log, model, resume)
    if training_args.do_eval:
        evaluate(trainer, log)
    if training_args.do_train:
        save_trained_model(save, trainer, plan.model, training_args, plan.sharded)
    return 0


def make_trainer(model, plan: RunPlan, log):
    """The Trainer of the run: CheckpointTrainer, or DistillTrainer with the frozen teacher (built here, after the
    student, without touching the RNG state) or the stored one (nothing to build)."""
    a = plan.training_args
    kwargs = dict(model=model, args=a, train_dataset=plan.train if a.do_train else None,
                  eval_dataset=plan.val if a.do_eval else None, callbacks=[log])
    if plan.distill is None:
        return CheckpointTrainer(**kwargs)
    from .distill_trainer import DistillTrainer

    d = plan.distill
    teacher = None if d.stored else load_teacher(d.path, d.family, d.config)
    return DistillTrainer(**kwargs, teacher=teacher, distill=d.settings)
