from .vha import Qwen3VHAAttention, init_premix, postmix

__all__ = ["Qwen3VHAAttention", "init_premix", "postmix"]
