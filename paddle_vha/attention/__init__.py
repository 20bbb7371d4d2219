from .vha import Qwen3VHAAttention, init_premix, postmix, premix

__all__ = ["Qwen3VHAAttention", "init_premix", "postmix", "premix"]
