"""Checkpoint folder against a family's declarations: config.json through the base's checks and the family's config
class, then every tensor name and shape from the headers (nothing read but headers). One-line CheckpointErrors."""
from __future__ import annotations

from ..checkpoint.contract import CheckpointError, compare_shapes
from ..checkpoint.folder import CheckpointFolder
from .base import Base
from .params import ModelSpec

__all__ = ["load_config", "validate", "check_layer_count"]


def load_config(folder, model_type: str, label: str, config_class, base: Base):
    """The typed config of a checkpoint folder of this family; config errors become one-line CheckpointErrors."""
    ck = CheckpointFolder.open(folder)
    if ck.model_type != model_type:
        raise CheckpointError(f"{ck.path}: not a {label} checkpoint (config.json model_type={ck.model_type!r}, "
                              f"expected {model_type!r})")
    try:
        base.check_fields(ck.config)  # as written, before the config class sees it
        cfg = config_class.from_dict(ck.config)
        base.check_config(cfg)
    except (ValueError, TypeError, AttributeError) as e:
        raise CheckpointError(f"{ck.path}/config.json: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    return cfg


def validate(folder, model_type: str, label: str, config_class, base: Base, spec: ModelSpec):
    """Check a checkpoint folder against a family's contract (config, then tensor names and shapes); its config."""
    ck = CheckpointFolder.open(folder)
    cfg = load_config(ck, model_type, label, config_class, base)
    check_layer_count(ck, cfg)
    compare_shapes(ck.path, ck.shapes, spec.tensor_shapes(cfg))
    return cfg


def check_layer_count(ck: CheckpointFolder, cfg) -> None:
    """A num_hidden_layers no folder of these tensors can hold (more layers than tensors) is refused before the
    expected tensor table is built from it (config.json's 10**30 layers built names until memory ran out)."""
    layers = getattr(cfg, "num_hidden_layers", 0)
    if isinstance(layers, int) and layers > len(ck.shapes):
        raise CheckpointError(f"{ck.path}/config.json: num_hidden_layers {layers:,} but the folder holds "
                              f"{len(ck.shapes):,} tensors in all")
