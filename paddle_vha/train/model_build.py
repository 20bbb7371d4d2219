"""The model a run trains, built in its compute dtype: single-device (loaded from model_name_or_path or freshly
initialised), sharded by paddle_vha.parallel's plan, or a pipeline stage."""
from __future__ import annotations

import copy
import os

from ..checkpoint.contract import CheckpointError
from .errors import TrainError
from .run_model import vocab_parallel_here

__all__ = ["compute_dtype", "build_model"]


def compute_dtype(training_args) -> str:
    """The dtype the weights are trained in: bfloat16 for AMP level O2 with bf16, else float32 (also for a checkpoint
    stored in bfloat16: PaddleFormers loads it widened, and the save narrows it back, paddle_vha/train/saving.py)."""
    return "bfloat16" if training_args.bf16 and training_args.fp16_opt_level == "O2" else "float32"


def build_model(model_cls, config, model_args, training_args, plan_tp: bool):
    """The model to train: sharded by paddle_vha.parallel (plan_tp), loaded from model_name_or_path, or freshly
    initialised; in compute_dtype (bfloat16 only for AMP level O2); its RMSNorms computing x² with paddle.square."""
    dtype = compute_dtype(training_args)
    config.dtype = dtype  # a checkpoint's config says bfloat16: build (and load) in the dtype training computes in
    if training_args.pipeline_model_parallel_size > 1:
        model = _build_pipeline_model(model_cls, config, model_args, training_args, plan_tp)
    elif plan_tp:
        model = _build_plan_parallel_model(model_cls, config, model_args, training_args)
    elif model_args.model_name_or_path:
        import tempfile

        from ..checkpoint.fsutil import linked_view

        with tempfile.TemporaryDirectory(prefix="paddle-vha-train-") as tmp:  # the loader's metadata lands here
            view = linked_view(model_args.model_name_or_path, os.path.join(tmp, "init"))
            try:
                model = model_cls.from_pretrained(view, config=config, dtype=dtype)
            except CheckpointError as e:  # a broken checkpoint, named as the user gave it (not the linked view)
                raise TrainError(str(e).replace(view, model_args.model_name_or_path)) from None
    else:
        model = model_cls(config)
    if dtype == "bfloat16":
        model = model.to(dtype=dtype)
    from .square_norm import use_square_norms

    use_square_norms(model)  # the same RMSNorm, 2x faster on Paddle's CPU kernels (paddle_vha/train/square_norm.py)
    return model


def _build_pipeline_model(model_cls, config, model_args, training_args, plan_tp: bool):
    """The family's pipe model (paddle_vha/modeling/pipe.py) for fleet's pipeline parallelism, with
    model_name_or_path's weights for this stage; one-line TrainErrors for what it cannot run."""
    import paddle.distributed as dist

    from ..modeling.pipe import load_stage_weights

    pp = training_args.pipeline_model_parallel_size
    if getattr(model_cls, "pipe_class", None) is None:
        raise TrainError(f"pipeline_model_parallel_size={pp}: {model_cls.__name__} has no pipeline-parallel form")
    if not hasattr(dist.ParallelEnv(), "_device_id"):  # Paddle's CPU build (docs/training.md, Pipeline parallelism)
        raise TrainError(f"pipeline_model_parallel_size={pp} needs a GPU build of Paddle: fleet's PipelineLayer "
                         "reads ParallelEnv().device_id, which this build does not set")
    if training_args.device == "cpu" and training_args.batch_p2p_comm:
        raise TrainError(f"pipeline_model_parallel_size={pp} on the CPU needs --batch_p2p_comm false (gloo has no "
                         "send / recv on the calculation stream, which batched p2p uses)")
    try:
        if plan_tp:  # PP x TP: each stage built whole (as at TP = 1), then sharded by the family's plan
            config.check_runtime_support(tensor_parallel_plan=True)
            config = copy.deepcopy(config)
            config.tensor_model_parallel_size = 1
        model = model_cls.pipe_class(config)
        if model_args.model_name_or_path:
            load_stage_weights(model, model_args.model_name_or_path)
    except (ValueError, CheckpointError) as e:  # VHAConfigError / MEAConfigError: what the pipe refuses
        raise TrainError(str(e)) from None
    if plan_tp:
        _shard_stage(model, training_args)
    return model


def _shard_stage(model, training_args) -> None:
    """This pipeline stage's decoder layers sharded over fleet's model-parallel group (paddle_vha.parallel)."""
    from paddle.distributed import fleet

    from ..parallel.apply import parallelize_model

    if training_args.device == "cpu":  # as in _build_plan_parallel_model: every mp rank reads the same batches
        fleet.fleet._user_defined_strategy.hybrid_configs["mp_configs"].need_broadcast_data = False
    # with vocab_parallel the head keeps its rank's logits for the parallel cross-entropy (tensor_parallel_output)
    state = parallelize_model(model, fleet.get_hybrid_communicate_group().get_model_parallel_group(),
                              vocab_parallel=vocab_parallel_here(training_args))
    print(_plan_line(state))


def _build_plan_parallel_model(model_cls, config, model_args, training_args):
    from paddle.distributed import fleet

    from ..parallel.apply import build_tensor_parallel_model

    if training_args.device == "cpu":
        # fleet's TensorParallel wrapper broadcasts each batch from mp rank 0, which asserts a GPU / XPU. Every
        # mp rank reads the same deterministic batches here, so fleet's own switch turns the broadcast off.
        fleet.fleet._user_defined_strategy.hybrid_configs["mp_configs"].need_broadcast_data = False
    group = fleet.get_hybrid_communicate_group().get_model_parallel_group()
    # the embedding and LM head split by vocabulary row; the head keeps its rank's logits for the parallel
    # cross-entropy (PaddleFormers' tensor_parallel_output) unless a teacher's KL needs the whole logits
    tp_output = bool(getattr(config, "tensor_parallel_output", True)) and not getattr(training_args, "teacher", None)
    try:  # single-device layers (loaded from model_name_or_path, if given), sharded by the plan
        model = build_tensor_parallel_model(model_cls, config, group, weights_from=model_args.model_name_or_path,
                                            vocab_parallel=vocab_parallel_here(training_args),
                                            tensor_parallel_output=tp_output,
                                            sequence_parallel=bool(getattr(training_args, "sequence_parallel", False)))
    except CheckpointError as e:
        raise TrainError(str(e)) from None
    print(_plan_line(model._vha_tp_state))
    return model


def _plan_line(state) -> str:
    """What the plan applied on this rank (its log): degree, vocabulary split, sequence parallelism."""
    sp = (f"sequence-parallel ({len(state.sequence_summed)} weights used on this rank's tokens only get their "
          f"gradients summed: {', '.join(state.sequence_summed[:3])}, ...)" if state.sequence_parallel else
          "no sequence parallelism")
    return (f"tensor parallel: rank {state.rank} of {state.t}; vocabulary "
            f"{'split by row' if state.vocab_parallel else 'whole'}; {sp}")
