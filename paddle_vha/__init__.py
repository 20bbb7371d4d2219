"""paddle-vha: Virtual Head Attention (and MEA) for PaddleFormers' Qwen3: train -> fold -> export -> serve.

Layout (docs/architecture.md): families.py (the registry) over the family folders vha/ and mea/, both built on
qwen3/; checkpoint/ (every folder's I/O); the stages train/, export/, serve/; parallel/ (tensor parallelism);
accounting.py (bytes and FLOPs); cli/ (the command lines, also installed as paddle-vha-* scripts).

Public names are imported lazily, so `import paddle_vha.cli` (used by the tools before Paddle loads) stays light.
"""
import importlib

__version__ = "0.2.0"

_EXPORTS = {
    "Qwen3VHAConfig": "paddle_vha.vha.config",
    "VHAConfigError": "paddle_vha.vha.config",
    "Qwen3VHAAttention": "paddle_vha.vha.attention",
    "Qwen3VHAModel": "paddle_vha.vha.modeling",
    "Qwen3VHAForCausalLM": "paddle_vha.vha.modeling",
    "Qwen3VHAPretrainedModel": "paddle_vha.vha.modeling",
    "Qwen3MEAConfig": "paddle_vha.mea.config",
    "MEAConfigError": "paddle_vha.mea.layers",
    "Qwen3MEAAttention": "paddle_vha.mea.attention",
    "Qwen3MEAModel": "paddle_vha.mea.modeling",
    "Qwen3MEAForCausalLM": "paddle_vha.mea.modeling",
    "CheckpointError": "paddle_vha.checkpoint.contract",
    "CheckpointFolder": "paddle_vha.checkpoint.folder",
    "family": "paddle_vha.families",
    "family_of": "paddle_vha.families",
}

__all__ = list(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'paddle_vha' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + __all__)
