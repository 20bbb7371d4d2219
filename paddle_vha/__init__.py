"""paddle-vha: Virtual Head Attention for PaddleFormers' Qwen3 (train -> fold -> export -> serve)."""
from .config import Qwen3VHAConfig, VHAConfigError
from .attention import Qwen3VHAAttention
from .modeling import Qwen3VHAForCausalLM, Qwen3VHAModel, Qwen3VHAPretrainedModel

__version__ = "0.1.0"

__all__ = [
    "Qwen3VHAConfig",
    "VHAConfigError",
    "Qwen3VHAAttention",
    "Qwen3VHAModel",
    "Qwen3VHAForCausalLM",
    "Qwen3VHAPretrainedModel",
]
