"""paddle-vha: Virtual Head Attention for PaddleFormers' Qwen3 (train -> fold -> export -> serve).

Public names are imported lazily, so `import paddle_vha.cli` (used by the tools before Paddle loads) stays light.
"""
import importlib

__version__ = "0.1.0"

_EXPORTS = {
    "Qwen3VHAConfig": "paddle_vha.config",
    "VHAConfigError": "paddle_vha.config",
    "Qwen3VHAAttention": "paddle_vha.attention",
    "Qwen3VHAModel": "paddle_vha.modeling",
    "Qwen3VHAForCausalLM": "paddle_vha.modeling",
    "Qwen3VHAPretrainedModel": "paddle_vha.modeling",
    "CheckpointError": "paddle_vha.checkpoint",
    "Qwen3MEAConfig": "paddle_vha.mea.config",
    "MEAConfigError": "paddle_vha.mea.config",
    "Qwen3MEAAttention": "paddle_vha.mea.attention",
    "Qwen3MEAModel": "paddle_vha.mea.modeling",
    "Qwen3MEAForCausalLM": "paddle_vha.mea.modeling",
}

__all__ = list(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'paddle_vha' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + __all__)
