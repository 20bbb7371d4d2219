"""Tensor parallelism, applied from outside the model (docs/tensor_parallel.md).

    from paddle_vha.parallel import parallelize_model, build_tensor_parallel_model
    model = build_tensor_parallel_model(Qwen3VHAForCausalLM, config, group)   # or parallelize_model(model, group)

plan.py         plans as data: LayerPlan, TensorShard, the GQA head split (each family's plan: its tp_plan.py)
apply.py        applies the family's plan (from the registry) to a built model in place; gathers full parameters /
                gradients; exact global grad norm
collectives.py  PyLayers on plain dist.all_reduce / all_gather (gloo on CPU, NCCL on GPU, same code)
vocab.py        vocabulary parallelism: embedding / LM head split by vocabulary row, parallel cross-entropy (fleet's
                ops on GPU, the same math on plain collectives on CPU)
pipe_vocab.py   vocabulary parallelism inside pipeline stages (PP x TP): the first stage's embedding, the last
                stage's LM head and cross-entropy, with vocab.py's parts
weights.py      weights per rank under the plan, counted from the config
sequence.py     sequence parallelism: between the TP regions each rank holds s/t tokens (fleet's sequence ops on GPU, a
                CPU stand-in where gloo has no reduce-scatter)

The sharded save and its merge into the single-device checkpoint format are in paddle_vha/parallel/tp_shards.py.
"""
import importlib

_EXPORTS = {
    "parallelize_model": "paddle_vha.parallel.apply",
    "build_tensor_parallel_model": "paddle_vha.parallel.apply",
    "check_plan": "paddle_vha.parallel.apply",
    "full_state": "paddle_vha.parallel.apply",
    "global_grad_norm": "paddle_vha.parallel.apply",
    "replica_divergence": "paddle_vha.parallel.apply",
    "tp_state": "paddle_vha.parallel.apply",
    "TPPlanError": "paddle_vha.spec.sharding",
    "save_tp_checkpoint": "paddle_vha.parallel.tp_shards",
    "merge_tp_checkpoint": "paddle_vha.parallel.tp_shards",
}

__all__ = list(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'paddle_vha.parallel' has no attribute {name!r}")
