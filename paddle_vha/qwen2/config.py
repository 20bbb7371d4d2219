"""Qwen2's config as its checkpoints are read: PaddleFormers' Qwen2Config, whose head width is hidden_size /
num_attention_heads unless config.json gives head_dim (as Hugging Face's Qwen2 reads it); PaddleFormers' own keeps no
head_dim attribute, which every shape here is computed from."""
from __future__ import annotations

from paddleformers.transformers import Qwen2Config as _PaddleFormersQwen2Config

__all__ = ["Qwen2Config"]


class Qwen2Config(_PaddleFormersQwen2Config):
    """PaddleFormers' Qwen2Config with `head_dim` always set (deviation: the parent leaves it absent)."""

    def __init__(self, head_dim=None, **kwargs):
        super().__init__(**kwargs)
        self.head_dim = self.hidden_size // self.num_attention_heads if head_dim is None else head_dim
