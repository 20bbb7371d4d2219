"""Tensor parallelism for Qwen3-VHA, applied from outside the model (docs/tensor_parallel.md).

    from paddle_vha.parallel import parallelize_model, build_tensor_parallel_model
    model = build_tensor_parallel_model(Qwen3VHAForCausalLM, config, group)   # or parallelize_model(model, group)

collectives.py  PyLayers on plain dist.all_reduce / all_gather (gloo on CPU, NCCL on GPU, same code)
plan.py         which rank holds which slice (pure arithmetic on the config)
apply.py        shards a built model in place; gathers full parameters / gradients; exact global grad norm
checkpoint.py   sharded save and the merge into the single-device checkpoint format (tools/merge_tp_checkpoint.py)
"""
import importlib

_EXPORTS = {
    "parallelize_model": "paddle_vha.parallel.apply",
    "build_tensor_parallel_model": "paddle_vha.parallel.apply",
    "full_state": "paddle_vha.parallel.apply",
    "global_grad_norm": "paddle_vha.parallel.apply",
    "replica_divergence": "paddle_vha.parallel.apply",
    "tp_state": "paddle_vha.parallel.apply",
    "TPPlanError": "paddle_vha.parallel.plan",
    "attention_layout": "paddle_vha.parallel.plan",
    "check_plan": "paddle_vha.parallel.plan",
    "save_tp_checkpoint": "paddle_vha.parallel.checkpoint",
    "merge_tp_checkpoint": "paddle_vha.parallel.checkpoint",
}

__all__ = list(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'paddle_vha.parallel' has no attribute {name!r}")
