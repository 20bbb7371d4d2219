"""Checkpoint behaviour every family's model classes share (a mixin put before the base's pretrained class).

* save_pretrained writes no PaddleFormers save marker;
* from_pretrained validates a folder against the family's declared tensors first (paddle_vha/spec/validate.py: one
  CheckpointError line on a malformed folder, nothing read but headers);
* PaddleFormers' flex-checkpoint name rules (`_gen_aoa_config` / `_gen_inv_aoa_config`) learn the family's Linears the
  base's rules do not know (each is [out, in] on disk and [in, out] in memory, so it needs a transpose both ways, or
  PaddleFormers writes it untransposed), and forget the base Linears the family does not have;
* sharded_state_dict (what the Trainer's flex-checkpoint saves as checkpoint-N/model_state, and from which it derives
  the optimizer moments' shards) declares each parameter paddle_vha.parallel split as this rank's slice of the global
  tensor (its TensorShard axis), so the save holds whole tensors and a load at any degree reassembles them.
"""
from __future__ import annotations

import os

from ..checkpoint.contract import CheckpointError
from ..checkpoint.folder import remove_save_marker
from ..checkpoint.fsutil import linked_view
from ..spec.validate import validate

__all__ = ["ContractCheckpointMixin", "linear_rules", "drop_tied_head", "declare_tp_shards"]


def drop_tied_head(aoa: dict, config) -> dict:
    """`aoa` (rules to disk) with a tied LM head not written: Hugging Face's layout holds the embedding only.
    PaddleFormers' Qwen2 / Qwen3 rules drop it; its Llama's do not, and an unmentioned parameter is written as it is."""
    if getattr(config, "tie_word_embeddings", False) and not any(
            s.split("->")[0].strip() == "lm_head.weight" for s in aoa["aoa_statements"]):
        aoa["aoa_statements"].append("lm_head.weight -> _")
    return aoa


def linear_rules(cls, aoa: dict, config, to_disk: bool) -> dict:
    """`aoa` (the base's rules for model class `cls`) adapted to the family's tensors (cls.family_spec)."""
    spec = cls.family_spec
    if to_disk:
        drop_tied_head(aoa, config)
    dropped = [f".{name}." for name in spec.dropped_base_linears(config)]
    aoa["aoa_statements"] = [s for s in aoa["aoa_statements"] if not any(d in s for d in dropped)]
    prefix = "" if cls == cls.base_model_class else "model."
    for name in spec.extra_linears(config):
        memory = f"{prefix}layers.$LAYER_ID.{name}.weight"
        disk = f"model.layers.$LAYER_ID.{name}.weight"
        src, dst = (memory, disk) if to_disk else (disk, memory)
        aoa["aoa_statements"].append(f"{src}^T -> {dst}")
    return aoa


def declare_tp_shards(sharded: dict, state) -> dict:
    """flex-checkpoint's sharded state dict with every split parameter of `state` (paddle_vha.parallel's TPState:
    t, rank, shards by parameter name) declared as rank `state.rank`'s part of the global tensor along its axis
    (rank k holds [k*n, (k+1)*n) of t*n). Whole parameters stay replicated entries (written once)."""
    from paddle.distributed.flex_checkpoint.dcp.sharded_weight import ShardedWeight

    split = {name: s.axis for name, s in state.shards.items() if s.axis is not None}
    for alias, name in getattr(state, "aliases", {}).items():  # a tied LM head, if the dict names it too
        if alias in sharded and name in split:
            split[alias] = split[name]
    missing = sorted(set(split) - set(sharded))
    if missing:  # a split parameter saved under another name would be written as if it were whole
        raise RuntimeError(f"sharded_state_dict has no entry for the tensor-parallel parameter {missing[0]}")
    for name, axis in split.items():
        sw = sharded[name]
        local = tuple(sw.local_tensor.shape)
        glob = tuple(n * state.t if a == axis else n for a, n in enumerate(local))
        offset = tuple(state.rank * n if a == axis else 0 for a, n in enumerate(local))
        sharded[name] = ShardedWeight(key=sw.key, local_tensor=sw.local_tensor, local_shape=local, global_shape=glob,
                                      global_offset=offset)
    return sharded


class ContractCheckpointMixin:
    """Class attributes set by paddle_vha.modeling.factory: family_spec, family_base, family_label."""

    def save_pretrained(self, save_dir, *args, **kwargs):
        super().save_pretrained(save_dir, *args, **kwargs)
        remove_save_marker(save_dir)

    def sharded_state_dict(self, *args, **kwargs):
        sharded = super().sharded_state_dict(*args, **kwargs)
        state = getattr(self, "_vha_tp_state", None)  # set by paddle_vha.parallel.parallelize_model
        return sharded if state is None or state.t == 1 else declare_tp_shards(sharded, state)

    @classmethod
    def validate_checkpoint(cls, folder):
        """Check a checkpoint folder (path or CheckpointFolder) against the family's contract; its config."""
        return validate(folder, cls.config_class.model_type, cls.family_label, cls.config_class, cls.family_base,
                        cls.family_spec)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *args, **kwargs):
        """Validated against the family's contract first; a folder is loaded through a temporary folder of links to
        its files (checkpoint/fsutil.linked_view), so that PaddleFormers' loader, which writes its flex-checkpoint
        metadata into the folder it loads, writes nothing into the user's checkpoint (a read-only folder loads)."""
        path = pretrained_model_name_or_path
        if not (isinstance(path, (str, os.PathLike)) and os.path.isdir(path)):
            return super().from_pretrained(path, *args, **kwargs)
        cls.validate_checkpoint(path)
        import tempfile

        with tempfile.TemporaryDirectory(prefix="paddle-vha-load-") as tmp:
            view = linked_view(os.fspath(path), os.path.join(tmp, "checkpoint"))
            try:
                return super().from_pretrained(view, *args, **kwargs)
            except CheckpointError as e:  # named as the user gave it, not the temporary view
                raise CheckpointError(str(e).replace(view, os.fspath(path))) from None

    @classmethod
    def _gen_aoa_config(cls, config):
        return linear_rules(cls, super()._gen_aoa_config(config), config, to_disk=False)

    @classmethod
    def _gen_inv_aoa_config(cls, config):
        return linear_rules(cls, super()._gen_inv_aoa_config(config), config, to_disk=True)
