"""The one work-around for Paddle's CPU gap in flex-checkpoint I/O (docs/training.md, "Output, checkpoints, resume").

Paddle 3.3's flex-checkpoint code moves each tensor it reshards, gathers or broadcasts with `Tensor.cuda()`
(`paddle/distributed/flex_checkpoint/dcp/reshard_comm.py`, `full_param.py`), which raises "No available device found"
on a CPU-only build, so a checkpoint could not be resumed at another layout, nor a model saved by several ranks. On
such a build `cuda_is_identity_on_cpu` makes `.cuda()` return the (CPU) tensor itself while its block runs; the
collectives then run on gloo. It wraps only the Trainer's checkpoint load (paddle_vha/train/resume.py) and the
collective save_pretrained (paddle_vha/train/saving.py); on a GPU, XPU or custom-device build it changes nothing.
"""
from __future__ import annotations

import contextlib

__all__ = ["cuda_is_identity_on_cpu"]


@contextlib.contextmanager
def cuda_is_identity_on_cpu():
    """On a Paddle build without CUDA / XPU / custom devices, `Tensor.cuda()` returns the tensor itself while the
    block runs (the module docstring); elsewhere nothing changes."""
    import paddle

    if paddle.is_compiled_with_cuda() or paddle.is_compiled_with_xpu() or paddle.device.get_all_custom_device_type():
        yield
        return
    original = paddle.Tensor.cuda
    paddle.Tensor.cuda = lambda self, *args, **kwargs: self
    try:
        yield
    finally:
        paddle.Tensor.cuda = original
