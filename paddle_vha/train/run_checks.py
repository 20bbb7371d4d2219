"""The one-line refusals of a run before anything is built: arguments PaddleFormers would accept but that cannot mean
what the user wants, a device this Paddle build cannot train on, and memory the machine lacks."""
from __future__ import annotations

import math
import os

from ..checkpoint.contract import CheckpointError
from ..checkpoint.fsutil import MARKER, check_no_overlap
from .errors import TrainError

__all__ = ["check_arguments", "check_device", "check_memory"]


def check_arguments(model_args, data_args, training_args) -> None:
    """TrainError (one line) for arguments PaddleFormers would accept but that cannot mean what the user wants."""
    from .trainable import check_trainable

    try:
        check_trainable(getattr(training_args, "train_only", "all"))
    except ValueError as e:
        raise TrainError(str(e)) from None
    lr = training_args.learning_rate
    if not (isinstance(lr, (int, float)) and math.isfinite(lr) and lr >= 0):
        raise TrainError(f"learning_rate must be a finite number >= 0, got {lr!r}")
    for name in ("per_device_train_batch_size", "per_device_eval_batch_size", "gradient_accumulation_steps"):
        if getattr(training_args, name) < 1:
            raise TrainError(f"{name} must be >= 1, got {getattr(training_args, name)}")
    if training_args.max_steps == 0 or training_args.max_steps < -1:
        raise TrainError(f"max_steps must be > 0, or -1 to train num_train_epochs, got {training_args.max_steps}")
    epochs = training_args.num_train_epochs
    if training_args.max_steps == -1 and not (isinstance(epochs, (int, float)) and math.isfinite(epochs) and epochs > 0):
        raise TrainError(f"num_train_epochs must be a finite number > 0 (max_steps is -1), got {epochs!r}")
    for name in ("seed", "data_seed"):  # numpy's and Paddle's generators take [0, 2**32)
        v = getattr(training_args, name, None)
        if v is not None and not 0 <= v < 2**32:
            raise TrainError(f"{name} must be in [0, 2**32), got {v}")
    out = training_args.output_dir
    if os.path.lexists(out) and not os.path.isdir(out):
        raise TrainError(f"output_dir {out}: exists and is not a folder")
    inputs = [model_args.model_name_or_path, data_args.input_dir if data_args.dataset == "pretrain" else None,
              training_args.teacher]
    if model_args.model_config and not model_args.model_config.lstrip().startswith("{"):
        inputs.append(model_args.model_config)
    inputs = [p for p in inputs if p and " " not in p.strip()]  # input_dir may also be a weighted blend "w1 P1 ..."
    try:  # the rule of every tool that writes, but an existing output_dir is a run to resume
        check_no_overlap(out, inputs, input_label="the input", out_label="output_dir")
    except CheckpointError as e:
        raise TrainError(str(e))
    model_dir = os.path.join(out, "model")
    if os.path.isdir(model_dir) and not os.path.isfile(os.path.join(model_dir, MARKER)):
        raise TrainError(f"{model_dir}: exists and was not written by paddle-vha; the trained model would replace it "
                         "(move it away first)")


def check_device(training_args) -> None:
    """TrainError for a device this Paddle build cannot train on, or half precision on the CPU."""
    import paddle

    if training_args.device.startswith("gpu") and not paddle.is_compiled_with_cuda():
        raise TrainError(f"device={training_args.device}, but this Paddle build has no CUDA (docs/install.md, GPU); "
                         "pass --device cpu to train on the CPU")
    if training_args.device == "cpu" and training_args.world_size > 1 and not training_args.use_hybrid_parallel \
            and training_args.recompute_granularity is None:
        raise TrainError("data parallelism without tensor parallelism on the CPU: Paddle's DataParallel reducer does not "
                         "sum the gradients on this build (the replicas drift apart); set recompute_granularity full "
                         "(full recompute: PaddleFormers then all-reduces them itself) or tensor_model_parallel_size")
    if training_args.device == "cpu" and (training_args.bf16 or training_args.fp16):
        raise TrainError("bf16 / fp16 training needs a GPU: Paddle's CPU kernels have no half-precision matmul; "
                         "pass --bf16 false --fp16 false on the CPU")


def check_memory(config, data_args, training_args, tp: int, refuse: bool = True, teacher=None) -> str:
    """The run's memory line (paddle_vha/train/memory.py); TrainError, before anything is built, when the machine
    lacks it (refuse). `teacher`: the teacher's config, whose weights count in full on every process."""
    from .memory import local_process_count, refuse_if_short, train_need, weight_count

    batch = max(training_args.per_device_train_batch_size, training_args.per_device_eval_batch_size)
    need, formula = train_need(config, batch, data_args.max_seq_len,
                               model_parallel=tp * max(1, training_args.pipeline_model_parallel_size),
                               saves=training_args.do_train, local_procs=local_process_count(),
                               teacher_weights=weight_count(teacher) if teacher is not None else 0)
    if not refuse:
        from ..units import fmt_bytes

        return f"memory: needs about {fmt_bytes(need)} ({formula})"
    return refuse_if_short(need, formula, TrainError)
