"""Tensor-parallel checkpoints: each rank saves its slices; `merge_tp_checkpoint` rebuilds the single checkpoint.

A sharded save is a folder with

    config.json                       the model's config (the single-device one: tensor_model_parallel_size 1)
    tp_plan.json                      format, t, the shard files, and per tensor its global (on-disk) shape,
                                      dtype and split axis (null: whole, stored once, by rank 0)
    tp-rank-00-of-02.safetensors ...  rank k's slices of the split tensors (and, for rank 0, the whole ones)

Tensor names and the on-disk layout are the Qwen3-VHA / Qwen3-MEA checkpoint contracts' (docs/checkpoint.md,
docs/mea.md: Linear weights [out, in]), so a split tensor is the global tensor cut along one on-disk axis into t
equal, rank-ordered parts. `merge_tp_checkpoint` concatenates them into a folder that the contract validators,
`from_pretrained` and tools/fold.py (VHA) read like any `save_pretrained` output.
"""
from __future__ import annotations

import json
import os
import shutil
from typing import Dict, List

import numpy as np

from ..families import family_of
from ..checkpoint import safetensors_io as st
from ..checkpoint.contract import INDEX_FILE, SINGLE_FILE, CheckpointError, is_linear_weight, read_json_object
from ..checkpoint.folder import tensor_refs
from ..checkpoint.fsutil import atomic_dir, check_output_dir

__all__ = ["PLAN_FILE", "FORMAT", "save_tp_checkpoint", "merge_tp_checkpoint", "merge_need", "read_tp_plan",
           "check_rank_files"]

PLAN_FILE = "tp_plan.json"
FORMAT = "paddle_vha.tp_shards.v1"
_CODES = {"float32": "F32", "float64": "F64", "float16": "F16", "bfloat16": "BF16"}


def _rank_file(k: int, t: int) -> str:
    return f"tp-rank-{k:02d}-of-{t:02d}.safetensors"


def _disk(name: str, x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x.T) if is_linear_weight(name, x.ndim) else x


def _to_numpy(p):
    import paddle

    x = p.detach()
    if x.dtype == paddle.bfloat16:
        import ml_dtypes

        return x.astype("float32").numpy().astype(ml_dtypes.bfloat16)
    return x.numpy()


def _write(path: str, tensors: Dict[str, np.ndarray]) -> None:
    specs = [(n, _CODES[str(a.dtype)], tuple(a.shape)) for n, a in tensors.items()]
    w = st.ShardWriter(path, specs)
    try:
        for n, a in tensors.items():
            w.write(n, a.reshape((1,) if a.ndim == 0 else a.shape))
        w.close()
    except BaseException:
        w.abort()
        raise


def save_tp_checkpoint(model, out_dir: str) -> None:
    """Every rank of a parallelized model writes its slices into out_dir (collective: call on every rank). Under
    data parallelism only the tensor-parallel group of global rank 0 writes (the replicas' files would be the same)."""
    import paddle.distributed as dist

    from ..parallel.apply import tp_state

    state = tp_state(model)
    if state is None:
        raise RuntimeError("save_tp_checkpoint: model is not tensor-parallel (use save_pretrained)")
    t, k = state.t, state.rank
    os.makedirs(out_dir, exist_ok=True)
    local: Dict[str, np.ndarray] = {}
    tensors = {}
    for name, p in model.named_parameters():
        shard = state.shard(name)
        a = _disk(name, _to_numpy(p))
        axis = shard.axis
        if axis is not None and is_linear_weight(name, a.ndim):
            axis = 1 - axis
        shape = list(a.shape)
        if axis is not None:
            shape[axis] *= t
        tensors[name] = {"shape": shape, "dtype": _CODES[str(a.dtype)], "axis": axis}
        if axis is not None or k == 0:
            local[name] = a
    ranks = getattr(state.group, "ranks", None)
    writes = ranks is None or 0 in ranks  # data-parallel replicas hold the same slices: one tensor-parallel group writes
    if writes:
        _write(os.path.join(out_dir, _rank_file(k, t)), local)
    if writes and k == 0:
        import copy

        cfg = copy.deepcopy(model.config)
        cfg.architectures = [type(model).__name__]
        cfg.tensor_model_parallel_size = 1
        cfg.dtype = str(next(iter(model.parameters())).dtype).split(".")[-1]  # as save_pretrained records it
        cfg.save_pretrained(out_dir)  # config.json exactly as the model's own save_pretrained writes it
        plan = {"format": FORMAT, "tensor_parallel_size": t, "files": [_rank_file(i, t) for i in range(t)],
                "tensors": tensors}
        with open(os.path.join(out_dir, PLAN_FILE), "w", encoding="utf-8") as f:
            json.dump(plan, f, indent=1)
            f.write("\n")
    dist.barrier(group=state.group)


def read_tp_plan(in_dir: str) -> dict:
    path = os.path.join(in_dir, PLAN_FILE)
    if not os.path.isfile(path):
        raise CheckpointError(f"{in_dir}: no {PLAN_FILE} (not a tensor-parallel sharded save)")
    plan = read_json_object(path)
    if plan.get("format") != FORMAT:
        raise CheckpointError(f"{path}: format {plan.get('format')!r}, expected {FORMAT!r}")
    t, files, tensors = plan.get("tensor_parallel_size"), plan.get("files"), plan.get("tensors")
    if not (isinstance(t, int) and t >= 1 and isinstance(files, list) and len(files) == t):
        raise CheckpointError(f"{path}: tensor_parallel_size and files do not describe t rank files")
    for fname in files:
        if not isinstance(fname, str) or fname in ("", ".", "..") or "/" in fname or os.sep in fname:
            raise CheckpointError(f"{path}: shard {fname!r} is not a file name inside the folder")
        if not os.path.isfile(os.path.join(in_dir, fname)):
            raise CheckpointError(f"{path}: lists shard {fname!r}, which is missing")
    if not isinstance(tensors, dict):
        raise CheckpointError(f"{path}: no \"tensors\" object")
    for name, info in tensors.items():
        shape = info.get("shape") if isinstance(info, dict) else None
        ok = (isinstance(shape, list) and all(isinstance(n, int) and n >= 0 for n in shape)
              and info.get("dtype") in st.DTYPES
              and (info.get("axis") is None or (isinstance(info["axis"], int) and 0 <= info["axis"] < len(shape)
                                                 and shape[info["axis"]] % t == 0)))
        if not ok:
            raise CheckpointError(f"{path}: malformed entry for tensor {name}")
    return plan


def check_rank_files(in_dir: str, plan: dict, refs: List[Dict[str, st.TensorRef]]) -> None:
    """Every rank file holds exactly what tp_plan.json says it holds (its slice of each split tensor; on rank 0 the
    whole ones too), each with the plan's dtype and its share of the plan's shape: CheckpointError (one line naming the
    rank file) otherwise, from the headers alone, before anything is written. A tensor the plan does not list, or a
    whole tensor stored again by another rank, would be dropped by the merge; a part in another dtype would be cast."""
    t = plan["tensor_parallel_size"]
    for k, fname in enumerate(plan["files"]):
        where = f"{in_dir}/{fname}"
        for name in sorted(refs[k], key=st.natural_key):
            info = plan["tensors"].get(name)
            if info is None:
                raise CheckpointError(f"{where}: holds {name}, which {PLAN_FILE} does not list; refusing to merge "
                                      "(it would be dropped)")
            if info["axis"] is None and k != 0:
                raise CheckpointError(f"{where}: holds {name}, which {PLAN_FILE} says rank 0 stores whole; refusing "
                                      "to merge (this rank's copy would be ignored)")
        for name, info in plan["tensors"].items():
            if info["axis"] is None and k != 0:
                continue
            ref = refs[k].get(name)
            if ref is None:
                raise CheckpointError(f"{where}: missing tensor {name}")
            want = list(info["shape"])
            if info["axis"] is not None:
                want[info["axis"]] //= t
            if ref.dtype != info["dtype"]:
                raise CheckpointError(f"{where}: {name} is {ref.dtype}, {PLAN_FILE} says {info['dtype']}; refusing "
                                      "to merge (a cast would change its values)")
            if list(ref.shape) != want and not (want == [] and list(ref.shape) == [1]):
                raise CheckpointError(f"{where}: {name} has shape {list(ref.shape)}, {PLAN_FILE} says rank {k}'s "
                                      f"part is {want}")


def _finite_part(ref: st.TensorRef, name: str, where: str) -> np.ndarray:
    """One rank's part of `name`, refused (CheckpointError naming the rank file) if it holds a NaN or Inf."""
    part = st.read_tensor(ref)
    try:
        st.cast_finite(part, ref.dtype, name)
    except ValueError as e:
        raise CheckpointError(f"{where}: {e}; refusing to merge") from None
    return part


def _side_files(in_dir: str, plan: dict) -> List[str]:
    """Plain files of a sharded save other than its config, plan and rank files (tokenizer, generation config, ...)."""
    own = {"config.json", PLAN_FILE, *plan["files"]}
    return sorted(f for f in os.listdir(in_dir) if f not in own and os.path.isfile(os.path.join(in_dir, f))
                  and not f.startswith("."))


def merge_need(in_dir: str) -> int:
    """Bytes merge_tp_checkpoint holds at most: the largest global tensor's parts, the merged tensor and its cast,
    plus the interpreter (~200 MB)."""
    plan = read_tp_plan(in_dir)
    largest = max((int(np.prod(i["shape"])) * st.DTYPES[i["dtype"]].itemsize for i in plan["tensors"].values()),
                  default=0)
    return 3 * largest + (200 << 20)


def merge_tp_checkpoint(in_dir: str, out_dir: str, force: bool = False, max_shard_size="5GB", finish=None) -> dict:
    """Rebuild the single-device Qwen3-VHA / Qwen3-MEA checkpoint from a sharded save; returns a summary dict.

    Reads one global tensor's parts at a time (memory: merge_need); copies the save's side files (tokenizer,
    generation config, chat template); writes atomically (a temporary sibling folder, renamed at the end)
    and validates the result against the checkpoint contract. finish(folder), if given, completes the merged folder
    before it is validated and renamed into place (the trainer adds the starting checkpoint's tokenizer files there).
    """
    plan = read_tp_plan(in_dir)  # first: is it a sharded save at all
    check_output_dir(out_dir, [in_dir], force, CheckpointError, input_label="SHARDS_DIR")
    t = plan["tensor_parallel_size"]
    refs: List[Dict[str, st.TensorRef]] = [tensor_refs(os.path.join(in_dir, fname)) for fname in plan["files"]]
    check_rank_files(in_dir, plan, refs)
    names = sorted(plan["tensors"], key=st.natural_key)
    specs = [(name, plan["tensors"][name]["dtype"], tuple(plan["tensors"][name]["shape"])) for name in names]

    with atomic_dir(out_dir, tool="merge_tp_checkpoint", replace=force) as tmp:
        shards = st.plan_shards(specs, st.parse_size(max_shard_size))
        weight_map, total = {}, 0
        for i, shard in enumerate(shards):
            fname = SINGLE_FILE if len(shards) == 1 else st.shard_name(i + 1, len(shards))
            w = st.ShardWriter(os.path.join(tmp, fname), shard)
            try:
                for name, code, shape in shard:
                    info = plan["tensors"][name]
                    holders = [0] if info["axis"] is None else range(t)
                    parts = [_finite_part(refs[k][name], name, f"{in_dir}/{plan['files'][k]}") for k in holders]
                    a = parts[0] if info["axis"] is None else np.concatenate(parts, axis=info["axis"])
                    if tuple(a.shape) != tuple(shape):
                        raise CheckpointError(f"{in_dir}: {name} merges to {list(a.shape)}, plan says {list(shape)}")
                    w.write(name, a.reshape((1,) if a.ndim == 0 else a.shape))
                    weight_map[name] = fname
                    total += a.nbytes
                w.close()
            except BaseException:
                w.abort()
                raise
        if len(shards) > 1:
            st.write_index(os.path.join(tmp, INDEX_FILE), weight_map, total)
        shutil.copyfile(os.path.join(in_dir, "config.json"), os.path.join(tmp, "config.json"))
        for fname in _side_files(in_dir, plan):  # tokenizer, generation config, chat template: kept for the runtime
            shutil.copy2(os.path.join(in_dir, fname), os.path.join(tmp, fname))
        if finish is not None:
            finish(tmp)
        family_of(tmp).validate(tmp)  # the merged folder meets its family's contract
    return {"tensor_parallel_size": t, "tensors": len(names), "bytes": total, "files": len(shards)}

