"""tools/train.py with the test harness's two CPU shims, for launches of tests/tp/launch.py (`shimmed=True`) and the
pipeline-parallel Trainer runs of tests/test_pipeline_parallel.py:

    python -m paddle.distributed.launch --nproc_per_node 4 tests/tp/train_shimmed.py CONFIG [--key value ...]

* Each `paddle.distributed.new_group` is followed by a barrier on the global group. With 4 gloo ranks on these
  machines, fleet's hybrid-group setup (the Trainer's fleet.init) fails intermittently with
  `pair.cc:784 connect [127.0.0.1]:PORT: Connection refused` while one rank is still creating the previous group;
  the barrier keeps the ranks in step. Nothing is retried.
* `ParallelEnv._device_id = 0` on a CPU build, which never sets it and fleet's PipelineLayer reads.

Both stay here, in the test harness, not in the product (docs/training.md, docs/tensor_parallel.md).
"""
import paddle.distributed as dist
from paddle.distributed.parallel import ParallelEnv

if not hasattr(ParallelEnv(), "_device_id"):
    ParallelEnv._device_id = 0

_new_group = dist.new_group


def _new_group_between_barriers(*args, **kwargs):
    if dist.get_world_size() > 1:
        dist.barrier()
    group = _new_group(*args, **kwargs)
    if dist.get_world_size() > 1:
        dist.barrier()
    return group


dist.new_group = _new_group_between_barriers

from paddle_vha.cli.train import entry  # noqa: E402

if __name__ == "__main__":
    entry()
