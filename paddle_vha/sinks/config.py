"""Qwen3SinksConfig: PaddleFormers' Qwen3Config for the folded form of a Qwen3-VHA with attention sinks (one field)."""
from __future__ import annotations

from paddleformers.transformers import Qwen3Config

from ..qwen3.runtime import RuntimeSupport

__all__ = ["Qwen3SinksConfig", "SinksConfigError", "WindowSinks"]


class SinksConfigError(ValueError):
    """A Qwen3-with-sinks configuration or runtime option this model does not support."""


class WindowSinks:
    """Which layers of a config with `window_attention_sinks` hold sinks (mixed into the folded families' configs)."""

    def window_layers(self):
        """Indices of the sliding-window layers (Qwen3's layer_types with a sliding_window)."""
        if not getattr(self, "sliding_window", None):
            return []
        return [i for i, t in enumerate(getattr(self, "layer_types", None) or []) if t == "sliding_attention"]

    def has_sinks(self, layer_idx: int) -> bool:
        """Whether decoder layer `layer_idx` holds sinks (a window layer, window_attention_sinks)."""
        return bool(getattr(self, "window_attention_sinks", False)) and layer_idx in self.window_layers()

    def _set_sinks(self, value, error) -> None:
        if not isinstance(value, bool):
            raise error(f"window_attention_sinks must be a bool, got {value!r}")
        self.window_attention_sinks = value


class Qwen3SinksConfig(WindowSinks, RuntimeSupport, Qwen3Config):
    r"""Configuration of Qwen3 whose sliding-window layers hold a learned sink logit per query head.

    Everything Qwen3Config accepts (`sliding_window`, `layer_types`), plus:
        window_attention_sinks (bool): a sink logit s_h per query head on the window layers (its tensor: spec.py);
            head h's softmax denominator gains exp(s_h) (docs/method.md, "Attention sinks"). Default True (the
            family's point); a config without window layers has no sink.
    """

    model_type = "qwen3_sinks"
    # what check_runtime_support refuses (paddle_vha/qwen3/runtime.py), and why
    runtime_label, runtime_error, causal_lm_name = "Qwen3 with sinks", SinksConfigError, "Qwen3SinksForCausalLM"

    def __init__(self, window_attention_sinks: bool = True, **kwargs):
        super().__init__(**kwargs)
        self._set_sinks(window_attention_sinks, SinksConfigError)
