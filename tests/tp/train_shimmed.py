"""tools/train.py with the test harness's two CPU shims, for launches of tests/tp/launch.py (`shimmed=True`) and the
pipeline-parallel Trainer runs of tests/test_pipeline_parallel.py:

    python -m paddle.distributed.launch --nproc_per_node 4 tests/tp/train_shimmed.py CONFIG [--key value ...]

* Each `paddle.distributed.new_group` rendezvouses through a TCPStore of its own. Paddle 3.3.1's gloo process groups
  all rendezvous through the one global TCPStore, and groups created one after the other read each other's
  addresses there: from 4 ranks on, fleet's hybrid-group setup (the Trainer's fleet.init) fails with
  `pair.cc:784 connect [127.0.0.1]:PORT: Connection refused`, `address.cc:30 sizeof(impl_) == bytes.size(). 136 vs
  45` or a `pair.cc:914 TIMEOUT`; a barrier around each new_group does not help (measured: 4 ranks creating groups
  [0,2], [1,3], [0,1], [2,3], [0,1,2,3] fail every time; with a store per group they pass). Global rank 0 hosts each
  store on a free port it broadcasts. Nothing is retried.
* `ParallelEnv._device_id = 0` on a CPU build, which never sets it and fleet's PipelineLayer reads.

Both stay here, in the test harness, not in the product (docs/tensor_parallel.md, "Running on CPU").
"""
import socket

import paddle.distributed as dist
from paddle.base import core
from paddle.distributed import collective
from paddle.distributed.parallel import ParallelEnv

if not hasattr(ParallelEnv(), "_device_id"):
    ParallelEnv._device_id = 0

_new_group = dist.new_group
_stores = []  # kept alive: a group's store is read again when its peers connect


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _new_group_own_store(*args, **kwargs):
    if dist.get_world_size() == 1 or collective._default_store is None:
        return _new_group(*args, **kwargs)
    port = [_free_port() if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(port, src=0)
    store = core.TCPStore("127.0.0.1", port[0], dist.get_rank() == 0, dist.get_world_size(), 900)
    _stores.append(store)
    shared, collective._default_store = collective._default_store, store
    try:
        return _new_group(*args, **kwargs)
    finally:
        collective._default_store = shared


dist.new_group = _new_group_own_store

from paddle_vha.cli.train import entry  # noqa: E402

if __name__ == "__main__":
    entry()
