"""Tensor parallelism for Qwen3-VHA and Qwen3-MEA, applied from outside the model (docs/tensor_parallel.md).

    from paddle_vha.parallel import parallelize_model, build_tensor_parallel_model
    model = build_tensor_parallel_model(Qwen3VHAForCausalLM, config, group)   # or parallelize_model(model, group)

collectives.py  PyLayers on plain dist.all_reduce / all_gather (gloo on CPU, NCCL on GPU, same code)
plan.py         which rank holds which slice of a Qwen3-VHA layer (pure arithmetic on the config)
mea_plan.py     the same for Qwen3-MEA: MEA layers and the stock layers of an MEA model
apply.py        shards a built model in place (a plan per decoder layer); gathers full parameters / gradients;
                exact global grad norm
mea_apply.py    the MEA / stock attention steps under TP
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
