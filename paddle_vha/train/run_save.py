"""OUTPUT_DIR/model in the documented checkpoint format: saved from rank 0 and validated, merged from
paddle_vha.parallel's shards, or one shard per pipeline stage."""
from __future__ import annotations

import os

from ..checkpoint.contract import CheckpointError
from .errors import TrainError
from .saving import finish_saved_folder, save_trained, source_float_dtype

__all__ = ["model_saver", "save_trained_model"]


def model_saver(model, model_args):
    """save(dest): the model written to `dest` with the starting checkpoint's tokenizer, generation config and chat
    template, its use_cache, and its stored dtype (paddle_vha/train/saving.py); save.finish(folder) finishes a folder
    written another way (the merged tensor-parallel save)."""
    source = model_args.model_name_or_path
    try:
        code = source_float_dtype(source)
    except CheckpointError as e:
        raise TrainError(str(e)) from None

    def save(dest: str) -> None:
        save_trained(model, dest, source, code)

    save.model, save.finish = model, (lambda folder: finish_saved_folder(folder, source, code))
    return save


def save_trained_model(save, trainer, run_model, training_args, sharded: bool) -> None:
    """OUTPUT_DIR/model in the documented format: merged from paddle_vha.parallel's shards (run_model.plan_tp),
    gathered by the Trainer (other model parallelism), or saved and validated from rank 0."""
    dest = os.path.join(training_args.output_dir, "model")
    if training_args.pipeline_model_parallel_size > 1:  # PP, PP x TP: one shard per stage (paddle_vha.parallel)
        from ..parallel.pipe_save import save_pipeline_model

        save_pipeline_model(save.model, dest, save.finish)
        if training_args.process_index == 0:
            run_model.family.validate(dest)
    elif run_model.plan_tp:
        _save_plan_parallel(save.model, training_args.output_dir, dest, save.finish)
    elif sharded:  # stock models under fleet's model parallelism: the Trainer gathers (not run by this project)
        trainer.save_model(dest)
    elif training_args.should_save or training_args.world_size > 1:  # collective with several ranks (saving.py)
        save(dest)
        if training_args.should_save:
            run_model.family.validate(dest)  # the folder must meet its documented contract
    if training_args.should_save:
        print(f"saved the trained model to {dest}")


def _save_plan_parallel(model, output_dir: str, dest: str, finish) -> None:
    """Every rank writes its slices; rank 0 merges them into the single-device format (validated) at `dest`."""
    import paddle.distributed as dist

    from ..parallel.tp_shards import merge_tp_checkpoint, save_tp_checkpoint

    shards = os.path.join(output_dir, "model-tp-shards")
    save_tp_checkpoint(model, shards)
    dist.barrier()
    if dist.get_rank() == 0:
        merge_tp_checkpoint(shards, dest, force=True, finish=finish)
    dist.barrier()
