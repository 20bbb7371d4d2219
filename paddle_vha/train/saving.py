"""The trained model's folder (OUTPUT_DIR/model, checkpoint-N/model): what a runtime needs, written atomically.

PaddleFormers' `save_pretrained` writes the weights, config.json and its own generation_config.json. For a run that
started from a checkpoint (`model_name_or_path`) that is not enough to serve or fold the result, so the folder is
finished before it is renamed into place:

* every side file of the starting checkpoint is copied (tokenizer.json, tokenizer_config.json,
  special_tokens_map.json, vocab.json / merges.txt / added_tokens.json, generation_config.json, chat_template.jinja,
  ...: what tools/convert_to_vha.py and tools/fold.py copy too); the checkpoint's generation_config.json replaces the
  one PaddleFormers derives (Qwen3's lists two EOS ids and its sampling defaults);
* config.json keeps the starting checkpoint's `use_cache` (true if it has none): the Trainer turns the cache off for
  training (TrainingArguments.use_cache defaults to false) and save_pretrained would write that;
* a checkpoint stored in 16-bit floats but trained in float32 (the CPU has no bfloat16 matmul) is written back in its
  own dtype: the float32 shards are narrowed tensor by tensor (round to nearest even), config.json's dtype says so.

Everything happens in the temporary folder of `atomic_dir`: the result appears complete or not at all.

With several ranks (data parallel, no model parallelism) PaddleFormers' save_pretrained is collective: it gathers
through flex-checkpoint, each rank writes its share of the tensors (files of its own) and all wait in a barrier. So
every rank calls `save_trained`; rank 0 picks the temporary folder (broadcast), writes config.json, finishes and
renames it.
"""
from __future__ import annotations

import json
import os
import shutil
from typing import Optional

from ..checkpoint import safetensors_io as st
from ..checkpoint.contract import INDEX_FILE
from ..checkpoint.folder import CheckpointFolder, remove_save_marker
from ..checkpoint.fsutil import atomic_dir

__all__ = ["save_trained", "finish_saved_folder", "source_float_dtype", "STORED_DTYPES"]

STORED_DTYPES = {"BF16": "bfloat16", "F16": "float16", "F32": "float32"}


def source_float_dtype(source: Optional[str]) -> Optional[str]:
    """The safetensors dtype code every floating tensor of the checkpoint `source` shares (BF16, F16, F32), or None
    (no source, or mixed dtypes)."""
    if not source:
        return None
    codes = {ref.dtype for ref in CheckpointFolder.open(source).tensors.values() if ref.dtype in st.FLOAT_CODES}
    return codes.pop() if len(codes) == 1 and codes <= set(STORED_DTYPES) else None


def _narrow_file(path: str, code: str) -> int:
    """Rewrite one safetensors file with its float32 tensors in `code`, tensor by tensor; returns its data bytes."""
    meta, refs = st.read_header(path)
    specs = [(name, code if ref.dtype == "F32" else ref.dtype, ref.shape) for name, ref in refs.items()]
    tmp = path + ".narrow"
    writer = st.ShardWriter(tmp, specs, metadata=meta or None)
    try:
        for name, new_code, shape in specs:
            ref = refs[name]
            for a, b in st.row_chunks(ref, 64 << 20):
                rows = st.read_rows(ref, a, b)
                writer.write(name, st.cast(rows, new_code) if new_code != ref.dtype else rows)
        writer.close()
    except BaseException:
        writer.abort()
        os.remove(tmp)
        raise
    os.replace(tmp, path)
    return writer.data_bytes


def _narrow_weights(folder: str, code: str) -> None:
    """Every float32 tensor of `folder` in `code` (BF16 / F16), the index's total_size updated."""
    index = os.path.join(folder, INDEX_FILE)
    files = sorted({os.path.basename(ref.path) for ref in CheckpointFolder(folder).tensors.values()})
    total = sum(_narrow_file(os.path.join(folder, f), code) for f in files)
    if os.path.isfile(index):
        with open(index, encoding="utf-8") as f:
            data = json.load(f)
        st.write_index(index, data["weight_map"], total)


def _write_config(folder: str, source_config: dict, code: Optional[str]) -> None:
    path = os.path.join(folder, "config.json")
    with open(path, encoding="utf-8") as f:
        cfg = json.load(f)
    use_cache = source_config.get("use_cache")
    cfg["use_cache"] = use_cache if isinstance(use_cache, bool) else True
    if code is not None:  # the weights were narrowed: say what they are now
        cfg["dtype"] = STORED_DTYPES[code]
        if "torch_dtype" in cfg:
            cfg["torch_dtype"] = STORED_DTYPES[code]
    with open(path, "w", encoding="utf-8") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")


def finish_saved_folder(folder: str, source: Optional[str], save_dtype: Optional[str] = None) -> None:
    """Make a freshly saved `folder` what a runtime needs (the module docstring): narrow its float32 weights to
    `save_dtype` (a safetensors code; None: keep them), fix config.json, copy `source`'s side files."""
    remove_save_marker(folder)
    stored = {ref.dtype for ref in CheckpointFolder(folder).tensors.values()}
    narrow = save_dtype if save_dtype in ("BF16", "F16") and "F32" in stored else None
    if narrow is not None:
        _narrow_weights(folder, narrow)
    src = CheckpointFolder.open(source) if source else None
    _write_config(folder, src.config if src else {}, narrow)
    if src is not None:
        for name in src.side_files()[0]:
            shutil.copyfile(os.path.join(src.path, name), os.path.join(folder, name))


def save_trained(model, dest: str, source: Optional[str] = None, save_dtype: Optional[str] = None) -> None:
    """model.save_pretrained into a temporary sibling of `dest`, finished (finish_saved_folder) and renamed into
    place: `dest` appears complete or not at all (an existing one is replaced only then). Collective when several
    ranks run: call it on every rank (the module docstring)."""
    import paddle.distributed as dist

    if dist.get_world_size() > 1:
        _save_trained_collective(model, dest, source, save_dtype)
        return
    with atomic_dir(dest) as tmp:
        model.save_pretrained(tmp)
        finish_saved_folder(tmp, source, save_dtype)


def _save_trained_collective(model, dest: str, source: Optional[str], save_dtype: Optional[str]) -> None:
    import contextlib

    import paddle.distributed as dist

    from .cpu_device import cuda_is_identity_on_cpu

    first = dist.get_rank() == 0
    with (atomic_dir(dest) if first else contextlib.nullcontext()) as tmp:
        folder = [tmp]
        dist.broadcast_object_list(folder, src=0)
        with cuda_is_identity_on_cpu():
            model.save_pretrained(folder[0], is_main_process=first)
        dist.barrier()  # every rank's files are written
        if first:
            finish_saved_folder(tmp, source, save_dtype)
    dist.barrier()  # `dest` is in place
