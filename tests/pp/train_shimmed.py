"""tools/train.py with the test-only CPU shim of tests/pp/pp_worker.py (ParallelEnv's device id), for the
pipeline-parallel Trainer run of tests/test_pipeline_parallel.py:

    python -m paddle.distributed.launch --nproc_per_node 2 tests/pp/train_shimmed.py CONFIG [--key value ...]
"""
from paddle.distributed.parallel import ParallelEnv

if not hasattr(ParallelEnv(), "_device_id"):  # a CPU build never sets it; fleet's PipelineLayer reads it
    ParallelEnv._device_id = 0

from paddle_vha.cli.train import entry  # noqa: E402

if __name__ == "__main__":
    entry()
