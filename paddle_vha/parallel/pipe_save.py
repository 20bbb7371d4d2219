"""The final save of a pipeline-parallel run (PP, PP x TP): the single-device checkpoint format, one shard per stage.

Each pipeline stage holds some decoder layers (the first also the embedding, the last the final norm and the LM
head), and under PP x TP each of its tensor-parallel ranks a slice of them. The save is collective over every rank:

* each stage gathers its split parameters over its tensor-parallel group (the family's plan says which axis), names
  every tensor as the plain model does (PaddleFormers' pipe name mapping: `model.layers.i.*`) and puts it in the
  on-disk layout (Linear weights [out, in]);
* the stage's first tensor-parallel rank of the first data-parallel replica writes them as one shard,
  `model-0000s-of-0000p.safetensors` (stage s of p), into the temporary folder global rank 0 picked;
* global rank 0 writes config.json (the single-device config) and the index, finishes the folder (the starting
  checkpoint's side files and stored dtype, paddle_vha/train/saving.py), and renames it into place.

No stage's tensors travel to another rank, so the save needs no more memory than training. A tied LM head (the last
stage's copy of the embedding) is not written: the checkpoint stores the embedding once, as the plain model does.
"""
from __future__ import annotations

import contextlib
import copy
import os
from typing import Dict

import numpy as np

from ..checkpoint import safetensors_io as st
from ..checkpoint.contract import INDEX_FILE
from ..checkpoint.fsutil import atomic_dir
from .apply import _gather, tp_state
from .tp_shards import _disk, _to_numpy, _write

__all__ = ["save_pipeline_model"]


def _stage_tensors(model) -> Dict[str, np.ndarray]:
    """This stage's tensors, whole (gathered over the tensor-parallel group), by the plain model's names, on disk."""
    if model._single_to_pp_mapping is None:
        model._set_pipeline_name_mapping()
    single = model._pp_to_single_mapping
    state = tp_state(model)
    out: Dict[str, np.ndarray] = {}
    for name, p in model.named_parameters():
        x = p.detach()
        shard = state.shard(name) if state is not None else None
        if shard is not None and state.t > 1 and shard.axis is not None:
            x = _gather(x, shard.axis, state.group)
        out[single[name]] = _disk(single[name], _to_numpy(x))
    if getattr(model.config, "tie_word_embeddings", False):
        out.pop("lm_head.weight", None)  # the last stage's copy of the embedding
    return out


def _writes_stage(hcg) -> bool:
    return (hcg.get_model_parallel_rank() == 0 and hcg.get_data_parallel_rank() == 0
            and hcg.get_sharding_parallel_rank() == 0)


def _write_config(model, folder: str) -> None:
    cfg = copy.deepcopy(model.config)
    cfg.architectures = [model.causal_lm_class.__name__]
    cfg.tensor_model_parallel_size = 1
    cfg.pipeline_model_parallel_size = 1
    cfg.dtype = str(next(iter(model.parameters())).dtype).split(".")[-1]  # as save_pretrained records it
    cfg.save_pretrained(folder)


def save_pipeline_model(model, dest: str, finish) -> None:
    """Write the pipe `model` (every stage, every rank) to `dest` in the single-device checkpoint format, atomically;
    `finish(folder)` completes the folder before the rename. Collective: call on every rank."""
    import paddle.distributed as dist
    from paddle.distributed import fleet

    hcg = fleet.get_hybrid_communicate_group()
    stage, stages = hcg.get_stage_id(), hcg.get_pipe_parallel_world_size()
    first = dist.get_rank() == 0
    with (atomic_dir(dest) if first else contextlib.nullcontext()) as tmp:
        where = [tmp]
        dist.broadcast_object_list(where, src=0)
        tensors = _stage_tensors(model)  # collective within the stage's tensor-parallel group
        shard = st.shard_name(stage + 1, stages)
        written = {}
        if _writes_stage(hcg):
            _write(os.path.join(where[0], shard), tensors)
            written = {name: (shard, int(a.nbytes)) for name, a in tensors.items()}
        everyone = []
        dist.all_gather_object(everyone, written)
        if first:
            weight_map = {n: f for part in everyone for n, (f, _) in part.items()}
            total = sum(b for part in everyone for _, b in part.values())
            st.write_index(os.path.join(tmp, INDEX_FILE), dict(sorted(weight_map.items(), key=lambda kv:
                                                                     st.natural_key(kv[0]))), total)
            _write_config(model, tmp)
            finish(tmp)
    dist.barrier()  # `dest` is in place
