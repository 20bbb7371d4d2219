"""Training and evaluation through the Trainer: where a run resumes from, trainer.train with the failures whose cause
is known turned into one line, the final non-finite check, and the validation loss."""
from __future__ import annotations

import errno
import math
import os

from .callbacks import TrainLog, nonfinite_parameter
from .errors import TrainError
from .paddleformers_trainer import get_last_checkpoint

__all__ = ["quiet_checkpoint_io", "resume_point", "train_model", "evaluate"]


def quiet_checkpoint_io() -> None:
    import logging
    import warnings

    logging.getLogger("paddle.distributed.fleet.utils.log_util").setLevel(logging.WARNING)  # checkpoint I/O chatter
    warnings.filterwarnings("ignore", message="The input state dict is empty")  # no fp32 master weights without AMP


def resume_point(training_args):
    """The checkpoint to resume from: resume_from_checkpoint, else output_dir's last checkpoint-N (announced; not
    with overwrite_output_dir), else None."""
    last = None
    if training_args.resume_from_checkpoint is None and os.path.isdir(training_args.output_dir) \
            and not training_args.overwrite_output_dir:
        last = get_last_checkpoint(training_args.output_dir)
        if last is not None:
            print(f"resuming from {last} (set overwrite_output_dir to start over)")
    return training_args.resume_from_checkpoint or last


def train_model(trainer, log: TrainLog, model, resume) -> None:
    """trainer.train (from `resume`), failures with a known cause as one-line TrainErrors, then the final NaN check,
    the Trainer's state and the last loss line."""
    try:
        result = trainer.train(resume_from_checkpoint=resume)
    except Exception as e:  # noqa: BLE001 - reported in one line where the cause is known
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise TrainError(_disk_full(trainer.args.output_dir, trainer.state.global_step, e)) from e
        why = _training_failure(e, trainer.state.global_step, log.steps_run, resume)
        if why is None:
            raise  # not a resume problem: the whole traceback is the useful report
        raise TrainError(why) from e
    if log.nonfinite is None:
        bad = nonfinite_parameter(model)  # after the last step, whether or not it was logged
        if bad is not None:
            log.nonfinite = (f"parameter {bad} holds NaN or Inf", trainer.state.global_step)
    if log.nonfinite is not None:
        what, step = log.nonfinite
        raise TrainError(f"training stopped: {what} at step {step}; nothing saved (lower learning_rate?)")
    trainer.save_state()
    if "loss" in log.last:
        step, loss = log.last["loss"]
        print(f"train: {result.global_step} steps; loss {loss:.4f} at step {step}")


def _disk_full(output_dir: str, step: int, e: OSError) -> str:
    """The one line for a disk that filled up during training; a checkpoint-N the failed save left half-written (no
    trainer_state.json, which the Trainer writes last) is removed, so that resuming never picks it."""
    import shutil

    partial = os.path.join(output_dir, f"checkpoint-{step}")
    removed = ""
    if os.path.isdir(partial) and not os.path.isfile(os.path.join(partial, "trainer_state.json")):
        shutil.rmtree(partial, ignore_errors=True)
        removed = f"; removed the half-written {partial}"
    where = f" writing {e.filename}" if e.filename else ""
    return (f"training stopped at step {step}: no space left on the device{where}{removed}; free disk space and run "
            "again (it resumes from the last complete checkpoint)")


def _training_failure(e: Exception, global_step: int, steps_run: int, resume):
    """The one line for an exception out of trainer.train whose cause is known, or None (re-raise it as it is)."""
    from .data_checks import IdRangeError

    if isinstance(e, IdRangeError):
        return f"training stopped at step {global_step + 1}: {e}; nothing saved"
    if isinstance(e, TrainError):  # already one line (a checkpoint refused at this layout, paddle_vha/train/resume.py)
        return str(e)
    if isinstance(e, ValueError) and "inf or nan" in str(e):  # PaddleFormers' loss check before each step
        return (f"training stopped: the loss is not finite at step {global_step + 1} ({str(e).split('. ')[-1]}); "
                "nothing saved (lower learning_rate?)")
    if resume is None or steps_run:
        return None
    first = (str(e).strip().splitlines() or [""])[0][:300]
    return (f"resuming from {resume} failed ({type(e).__name__}: {first}); remove that checkpoint folder or set "
            "overwrite_output_dir")


def evaluate(trainer, log: TrainLog) -> None:
    """The validation loss at the last step (evaluated now unless it was logged there); TrainError if not finite."""
    step, loss = log.last.get("eval_loss", (None, None))
    if step != trainer.state.global_step:  # not evaluated at the last step yet
        loss = trainer.evaluate().get("eval_loss")
    if loss is not None and not math.isfinite(loss):
        raise TrainError(f"validation loss is {loss} at step {trainer.state.global_step}; nothing saved")
    if loss is not None:
        print(f"validation: loss {loss:.4f} (perplexity {math.exp(min(loss, 50)):.2f} per token) "
              f"at step {trainer.state.global_step}")
