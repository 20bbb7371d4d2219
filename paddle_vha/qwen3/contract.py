"""What a Qwen3 config.json must hold before any family reads it: positive integer sizes, finite positive eps and
RoPE base, a RoPE scaling paddle-vha implements (paddle_vha/qwen3/rope_scaling.py), windows named where layer_types
asks for them; the decoder layers' name prefix.

The tensors themselves (names, shapes) are declared in paddle_vha/qwen3/spec.py and each variant's spec.py.
"""
from __future__ import annotations

import math

from .rope_scaling import rope_fields_problem

__all__ = ["layer_prefix", "check_config", "check_config_fields", "sliding_window_layers"]

_SIZES = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
          "num_key_value_heads", "head_dim", "max_position_embeddings")

_FLAGS = ("tie_word_embeddings", "attention_bias", "use_sliding_window")  # JSON booleans ("false" is truthy)


def _activations() -> set:
    """The hidden_act names PaddleFormers' Qwen3 MLP can build."""
    from paddleformers.transformers.activations import ACT2FN

    return set(ACT2FN)


def check_config_fields(fields: dict) -> None:
    """ValueError (one line naming the field) for a Qwen3 size that is not a positive int, a flag that is not a JSON
    boolean (tie_word_embeddings "false" is a true string), an eps / RoPE base that
    is not a positive finite number, a RoPE scaling that is not an object or that paddle-vha does not implement as
    PaddleFormers and transformers both read it (paddle_vha/qwen3/rope_scaling.py), or an unknown hidden_act, among the fields
    present in `fields` (config.json as read, before a config
    class sees it: Qwen3Config itself turns a 4.0 or a null into a traceback that names no field)."""
    for name in _SIZES:
        if name in fields:
            v = fields[name]
            if not (isinstance(v, int) and not isinstance(v, bool) and v >= 1):
                raise ValueError(f"{name} must be a positive int, got {v!r}")
    for key in ("rope_parameters", "rope_scaling"):
        r = fields.get(key)
        if r is not None and not (isinstance(r, dict) and isinstance(r.get("rope_type", r.get("type", "")), str)):
            raise ValueError(f"{key} must be an object with a string rope_type (or null), got {r!r}"[:200])
    why = rope_fields_problem(fields)
    if why:
        raise ValueError(why[:300])
    for name in _FLAGS:
        if name in fields and fields[name] is not None and not isinstance(fields[name], bool):
            raise ValueError(f"{name} must be true or false, got {fields[name]!r}"[:200])
    act = fields.get("hidden_act")
    if act is not None and act not in _activations():
        raise ValueError(f"hidden_act {act!r} is not an activation PaddleFormers knows "
                         f"({', '.join(sorted(_activations()))})"[:300])
    rope = fields.get("rope_parameters")
    numbers = [("rms_norm_eps", fields[k]) for k in ("rms_norm_eps",) if k in fields]
    numbers += [("rope_theta", fields["rope_theta"])] if "rope_theta" in fields else []
    numbers += [("rope_theta", rope["rope_theta"])] if isinstance(rope, dict) and "rope_theta" in rope else []
    for name, v in numbers:
        if not (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0):
            raise ValueError(f"{name} must be a positive finite number, got {v!r}")


def check_config(cfg) -> None:
    """check_config_fields over every field of a built config object (defaults included), and sliding-window layers
    that name their window."""
    fields = {name: getattr(cfg, name, None) for name in _SIZES + ("rms_norm_eps", "rope_theta")}
    for key in ("rope_parameters", "rope_scaling", "partial_rotary_factor"):
        if getattr(cfg, key, None) is not None:  # (a null config.json field is refused from the file itself)
            fields[key] = getattr(cfg, key)
    fields["hidden_act"] = getattr(cfg, "hidden_act", None)
    check_config_fields(fields)
    window = getattr(cfg, "sliding_window", None)
    if "sliding_attention" in (getattr(cfg, "layer_types", None) or []) and not (
            isinstance(window, int) and not isinstance(window, bool) and window >= 1):
        raise ValueError(f"layer_types names sliding_attention layers but sliding_window is {window!r} (set "
                         "use_sliding_window=true and sliding_window to a positive int)")


def sliding_window_layers(cfg) -> list:
    """Indices of the layers that attend through a sliding window (Qwen3's layer_types + sliding_window)."""
    if not getattr(cfg, "sliding_window", None):
        return []
    return [i for i, t in enumerate(getattr(cfg, "layer_types", None) or []) if t == "sliding_attention"]


def layer_prefix(i: int) -> str:
    return f"model.layers.{i}."
