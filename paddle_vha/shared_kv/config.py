"""Qwen3SharedKVConfig: PaddleFormers' Qwen3Config for the folded form of shared-KV Qwen3-VHA (no new fields)."""
from __future__ import annotations

from paddleformers.transformers import Qwen3Config

from ..qwen3.runtime import RuntimeSupport
from ..sinks.config import WindowSinks

__all__ = ["Qwen3SharedKVConfig", "SharedKVConfigError"]


class SharedKVConfigError(ValueError):
    """A Qwen3 shared-KV configuration or runtime option this model does not support."""


class Qwen3SharedKVConfig(WindowSinks, RuntimeSupport, Qwen3Config):
    r"""Configuration of Qwen3 with one shared K = V projection per layer (spec.py; H_kv heads of width d).

    Everything Qwen3Config accepts; num_attention_heads query heads read the H_kv shared heads as in GQA. Plus
    window_attention_sinks (bool, default False): a sink logit per query head on the window layers (what a shared-KV
    Qwen3-VHA with sinks folds into; docs/method.md, "Attention sinks").
    """

    model_type = "qwen3_shared_kv"
    # what check_runtime_support refuses (paddle_vha/qwen3/runtime.py), and why
    runtime_label, runtime_error = "Qwen3 shared-KV", SharedKVConfigError
    causal_lm_name, fused_qkv_reason = "Qwen3SharedKVForCausalLM", " (one projection is both K and V)"

    def __init__(self, window_attention_sinks: bool = False, **kwargs):
        super().__init__(**kwargs)
        self._set_sinks(window_attention_sinks, SharedKVConfigError)
