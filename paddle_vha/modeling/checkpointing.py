"""Checkpoint behaviour every family's model classes share (a mixin put before the base's pretrained class).

* save_pretrained writes no PaddleFormers save marker;
* from_pretrained validates a folder against the family's declared tensors first (paddle_vha/spec/validate.py: one
  CheckpointError line on a malformed folder, nothing read but headers);
* PaddleFormers' flex-checkpoint name rules (`_gen_aoa_config` / `_gen_inv_aoa_config`) learn the family's Linears the
  base's rules do not know (each is [out, in] on disk and [in, out] in memory, so it needs a transpose both ways, or
  PaddleFormers writes it untransposed), and forget the base Linears the family does not have.
"""
from __future__ import annotations

import os

from ..checkpoint.folder import remove_save_marker
from ..spec.validate import validate

__all__ = ["ContractCheckpointMixin", "linear_rules"]


def linear_rules(cls, aoa: dict, config, to_disk: bool) -> dict:
    """`aoa` (the base's rules for model class `cls`) adapted to the family's tensors (cls.family_spec)."""
    spec = cls.family_spec
    dropped = [f".{name}." for name in spec.dropped_base_linears(config)]
    aoa["aoa_statements"] = [s for s in aoa["aoa_statements"] if not any(d in s for d in dropped)]
    prefix = "" if cls == cls.base_model_class else "model."
    for name in spec.extra_linears(config):
        memory = f"{prefix}layers.$LAYER_ID.{name}.weight"
        disk = f"model.layers.$LAYER_ID.{name}.weight"
        src, dst = (memory, disk) if to_disk else (disk, memory)
        aoa["aoa_statements"].append(f"{src}^T -> {dst}")
    return aoa


class ContractCheckpointMixin:
    """Class attributes set by paddle_vha.modeling.factory: family_spec, family_base, family_label."""

    def save_pretrained(self, save_dir, *args, **kwargs):
        super().save_pretrained(save_dir, *args, **kwargs)
        remove_save_marker(save_dir)

    @classmethod
    def validate_checkpoint(cls, folder):
        """Check a checkpoint folder (path or CheckpointFolder) against the family's contract; its config."""
        return validate(folder, cls.config_class.model_type, cls.family_label, cls.config_class, cls.family_base,
                        cls.family_spec)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *args, **kwargs):
        if isinstance(pretrained_model_name_or_path, (str, os.PathLike)) and os.path.isdir(pretrained_model_name_or_path):
            cls.validate_checkpoint(pretrained_model_name_or_path)
        return super().from_pretrained(pretrained_model_name_or_path, *args, **kwargs)

    @classmethod
    def _gen_aoa_config(cls, config):
        return linear_rules(cls, super()._gen_aoa_config(config), config, to_disk=False)

    @classmethod
    def _gen_inv_aoa_config(cls, config):
        return linear_rules(cls, super()._gen_inv_aoa_config(config), config, to_disk=True)
