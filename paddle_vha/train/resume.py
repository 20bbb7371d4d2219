"""Resuming the Trainer's flex-checkpoints (checkpoint-N/model_state, optimizer_state) at any tensor-parallel degree.

PaddleFormers 1.0.0 saves and loads checkpoint-N through Paddle's flex-checkpoint (`dist.save_state_dict` /
`dist.load_state_dict` of `model.sharded_state_dict()`): every tensor is recorded with its global shape and this
rank's offset (paddle_vha/modeling/checkpointing.py declares paddle_vha.parallel's split parameters), and the loader
reassembles / re-slices them for the layout that resumes. `CheckpointTrainer` adds two things around that load:

* refusal first: the checkpoint's recorded global shapes must be the model's (one line naming the first tensor that
  differs). A checkpoint written before the split parameters were declared holds one rank's slice recorded as if it
  were whole (e.g. gate_proj [64, 88] of [64, 176]); loading it would run with wrong weights;
* the CPU gap: Paddle 3.3's resharder moves each tensor it reads or sends with `Tensor.cuda()`, which raises
  "No available device found" on a CPU-only build; the load runs inside paddle_vha/train/cpu_device.py's
  `cuda_is_identity_on_cpu` (nothing changes on a GPU build).

And one thing around the save: under hybrid parallelism with data-parallel replicas (DP x TP, DP x PP) PaddleFormers
1.0.0 saves the optimizer state on replica 0's ranks only (`dp_group.rank <= 0`), but flex-checkpoint's
`save_state_dict` synchronises over every rank by default, so replica 0 waits for ranks that never come (a gloo /
NCCL timeout at the first checkpoint-N). The other replicas hold the same moments; `CheckpointTrainer` hands that
save a process group of replica 0's ranks (created once, on every rank, when the Trainer is built).
"""
from __future__ import annotations

import contextlib
import os

from .cpu_device import cuda_is_identity_on_cpu
from .errors import TrainError
from .paddleformers_trainer import Trainer

__all__ = ["CheckpointTrainer", "check_resumable", "saved_global_shapes"]

MODEL_STATE = "model_state"  # PaddleFormers' MODEL_STATE_DIC


def saved_global_shapes(folder: str) -> dict:
    """{tensor name: global shape} recorded in a flex-checkpoint folder's .metadata (the union of its shards' extents
    where an entry records no global shape)."""
    import paddle

    metas = [f for f in os.listdir(folder) if f.endswith(".metadata")]
    if len(metas) != 1:
        raise TrainError(f"{folder}: expected one .metadata file, found {len(metas)}")
    meta = paddle.load(os.path.join(folder, metas[0]))
    out = {}
    for name, parts in meta.state_dict_metadata.items():
        shapes = {tuple(p.global_shape) for p in parts if p.global_shape is not None}
        if len(shapes) == 1:
            out[name] = shapes.pop()
        else:  # the extent the shards cover
            ends = [tuple(o + n for o, n in zip(p.global_offset, p.local_shape)) for p in parts]
            out[name] = tuple(max(e) for e in zip(*ends))
    return out


def check_resumable(checkpoint: str, model_sharded: dict) -> None:
    """TrainError (one line) unless checkpoint/model_state records every tensor of the model with the model's global
    shape: a checkpoint of another model, or one whose split tensors were saved as one rank's slice."""
    folder = os.path.join(checkpoint, MODEL_STATE)
    if not os.path.isdir(folder):
        raise TrainError(f"cannot resume from {checkpoint}: no {MODEL_STATE}/ (not a checkpoint of this trainer)")
    saved = saved_global_shapes(folder)
    for name in sorted(model_sharded):
        want = tuple(model_sharded[name].global_shape)
        if name not in saved:
            raise TrainError(f"cannot resume from {checkpoint}: it has no tensor {name} (another model?)")
        if tuple(saved[name]) != want:
            raise TrainError(f"cannot resume from {checkpoint}: it records {name} as {list(saved[name])}, the model's "
                             f"is {list(want)} (a tensor-parallel checkpoint that kept one rank's slice, or another "
                             "model); it cannot be loaded at any layout: remove that checkpoint folder or set "
                             "overwrite_output_dir")


class CheckpointTrainer(Trainer):
    """PaddleFormers' Trainer whose flex-checkpoint resume refuses a checkpoint the model cannot take and runs on a
    CPU-only Paddle build (the module docstring)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._replica_zero = _replica_zero_group(self.args)

    def _save_flex_optimizer_state(self, output_dir):
        with _save_state_dict_over(self._replica_zero):
            return super()._save_flex_optimizer_state(output_dir)

    def _load_flex_checkpoint(self, resume_from_checkpoint):
        if not getattr(self.args, "load_from_hf", False):  # a Hugging Face folder has no model_state/ to check
            check_resumable(resume_from_checkpoint, self.model.sharded_state_dict())
        with cuda_is_identity_on_cpu():
            return super()._load_flex_checkpoint(resume_from_checkpoint)


def _replica_zero_group(args):
    """The process group of data-parallel replica 0's ranks under hybrid parallelism with replicas, else None.
    Collective: every rank creates it (the module docstring)."""
    import paddle.distributed as dist

    if not getattr(args, "use_hybrid_parallel", False) or dist.get_world_size() == 1:
        return None
    from paddle.distributed import fleet

    hcg = fleet.get_hybrid_communicate_group()
    if hcg.get_data_parallel_world_size() == 1:
        return None
    return dist.new_group(hcg.topology().get_axis_list("data", 0))


@contextlib.contextmanager
def _save_state_dict_over(group):
    """paddle.distributed.save_state_dict synchronising over `group` (None: unchanged) inside the block."""
    import paddle.distributed as dist

    if group is None:
        yield
        return
    save = dist.save_state_dict

    def over_group(*args, **kwargs):
        kwargs.setdefault("process_group", group)
        return save(*args, **kwargs)

    dist.save_state_dict = over_group
    try:
        yield
    finally:
        dist.save_state_dict = save
