"""Qwen3SharedKVConfig: PaddleFormers' Qwen3Config for the folded form of shared-KV Qwen3-VHA (no new fields)."""
from __future__ import annotations

from paddleformers.transformers import Qwen3Config

__all__ = ["Qwen3SharedKVConfig", "SharedKVConfigError"]


class SharedKVConfigError(ValueError):
    """A Qwen3 shared-KV configuration or runtime option this model does not support."""


class Qwen3SharedKVConfig(Qwen3Config):
    r"""Configuration of Qwen3 with one shared K = V projection per layer (`shared_kv_proj`, H_kv heads of width d).

    Everything Qwen3Config accepts; num_attention_heads query heads read the H_kv shared heads as in GQA.
    """

    model_type = "qwen3_shared_kv"

    def check_runtime_support(self, tensor_parallel_plan: bool = False) -> None:
        """Raise SharedKVConfigError for runtime options (set by trainers after construction) it does not support."""
        if self.fuse_attention_qkv:
            raise SharedKVConfigError("fuse_attention_qkv=True is not supported by Qwen3 shared-KV (one projection "
                                      "is both K and V); set fuse_attention_qkv=False")
        if self.tensor_model_parallel_size > 1 and not tensor_parallel_plan:
            raise SharedKVConfigError(
                f"tensor_model_parallel_size={self.tensor_model_parallel_size}: Qwen3 shared-KV is tensor-parallel "
                "only through paddle_vha.parallel: build with paddle_vha.parallel.build_tensor_parallel_model(...)")
        if self.sequence_parallel:
            raise SharedKVConfigError("sequence_parallel=True is not supported by Qwen3 shared-KV")
