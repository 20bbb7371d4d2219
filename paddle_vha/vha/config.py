"""The Virtual Head Attention fields over a base's config: `VHAConfigMixin` (the fields, their defaults, upstream's
names, their checks) and Qwen3VHAConfig, PaddleFormers' Qwen3Config with them (Llama-VHA and Qwen2-VHA put the same
mixin over their bases' configs: paddle_vha/llama/, paddle_vha/qwen2/).

Notation used throughout the package (see docs/method.md):
    h     hidden_size
    d     head_dim                          width of a virtual query / key / value head
    H_kv  num_key_value_heads               KV heads (what the cache stores)
    H_v   num_attention_heads               virtual query heads (what attention sees)
    H_p   H_v // H_kv                       physical query heads (what q_proj emits)
    r     vha_q_head_dim (default d)        width of a physical query head
    R     vha_postmix_rank                  rank of the Postmix head-mixing term

With vha_premix=false (the research fork's premix-off mode, `vha_enable_premix: false`) q_proj emits all H_v query heads
of width d as stock Qwen3 does (H_p = H_v physical heads, r = d) and only Postmix is added.
"""
from __future__ import annotations

import copy
import functools
import inspect
import math
from dataclasses import dataclass
from typing import List, Optional

from paddleformers.transformers import Qwen3Config

from ..qwen3.runtime import RuntimeSupport
from . import fleet_config, postmix_form
from .cost import DEFAULT_POSTMIX_RANK

__all__ = ["Qwen3VHAConfig", "VHAConfigMixin", "VHAConfigError", "LayerDims"]


class VHAConfigError(ValueError):
    """A Qwen3-VHA configuration that cannot describe a valid model."""


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _rope_theta(cfg):
    return (getattr(cfg, "rope_parameters", None) or {}).get("rope_theta", getattr(cfg, "rope_theta", None))


@dataclass(frozen=True)
class LayerDims:
    """The attention sizes of one decoder layer (sliding-window layers may have their own)."""

    window: Optional[int]  # sliding window in positions, None for full attention
    num_heads: int  # H_v virtual query heads
    num_kv_heads: int  # H_kv
    head_dim: int  # d
    q_head_dim: int  # r
    postmix_rank: int  # R
    rope_theta: float
    premix: bool = True  # False: no Premix, q_proj emits the H_v heads themselves

    @property
    def num_physical_heads(self) -> int:
        return self.num_heads // self.num_kv_heads if self.premix else self.num_heads


@functools.lru_cache(maxsize=None)
def _defaults_of(config_class: type) -> dict:
    return {k: p.default for k, p in inspect.signature(config_class.__init__).parameters.items()}


def _parent_config(cls: type) -> type:
    """The base's own config class under a VHA config class (Qwen3Config under Qwen3VHAConfig)."""
    return next(c for c in cls.__mro__[1:] if "model_type" in vars(c) and not issubclass(c, VHAConfigMixin))


_WINDOW_FIELDS = ("vha_window_num_attention_heads", "vha_window_num_key_value_heads", "vha_window_head_dim",
                  "vha_window_rope_theta")


class VHAConfigMixin:
    r"""The Virtual Head Attention fields, put before RuntimeSupport and a base's config class.

    Everything the base's config accepts, plus:

    Args:
        vha_q_head_dim (int, optional): width r of a physical query head, 1 <= r <= head_dim.
            Defaults to head_dim.
        vha_postmix_rank (int): rank R of Postmix, M = I + V U^T with U, V of shape [H_v, R]. Default 4 (upstream
            configs: H_v // 4, their default).
        vha_gated_attention (bool): sigmoid output gate after Postmix (blocks the Postmix fold). Default False.
        vha_premix_init_alpha (float): Premix starts at I + alpha/sqrt(d) * N(0, 1). Default 0.1.
        vha_postmix_u_init_std (float): U ~ N(0, std). Default 0.01.
        vha_postmix_v_init_std (float): V ~ N(0, std); 0 makes Postmix the identity at step 0. Default 0.0.
        vha_fused_prologue (bool or None): fused Premix + q/k RMSNorm + RoPE operator (ops/, docs/prologue.md).
            None (default): use it when it builds and loads, else the composed path with one logged line;
            True: require it; False: always the composed path.
        vha_postmix_form (str): how Postmix is computed, same result to rounding: "lowrank" (Z = U^T Y, then
            Y + V Z), "dense" (M = I + V U^T, one GEMM) or "auto" (default: the form measured faster for the layer's
            shape; low-rank under tensor parallelism). paddle_vha/vha/postmix_form.py.
        vha_shared_kv (bool): one shared K = V projection (hidden -> H_kv*d, spec.py) replaces k_proj and v_proj; after
            k_norm and RoPE it is both the keys and the values, and the attention output is rotated back (inverse
            RoPE at the query's position) before Postmix. The cache holds one tensor per layer. Default False.

    Sliding-window layers are Qwen3's: `sliding_window` (positions a query sees, its own included) and `layer_types`
    ("sliding_attention" / "full_attention" per layer). VHA on those layers may use its own sizes (None: as the full
    layers; upstream PaddleFleet's swa_vha_q_lora_rank, swa_vha_postmix_rank, swa_num_attention_heads, ...):
        vha_window_q_head_dim, vha_window_postmix_rank: r and R of window layers (both fold away).
        vha_window_num_attention_heads, vha_window_num_key_value_heads, vha_window_head_dim, vha_window_rope_theta:
            other head counts, head width or RoPE base on window layers. Trainable; such a model has no stock-Qwen3
            form, so fold refuses it, naming the layer.
        window_attention_sinks (bool): a learned sink logit s_h per (virtual) head of every window layer
            (its tensor: spec.py; docs/method.md "Attention sinks"): the softmax denominator gains exp(s_h), the
            output no value. Upstream's add_swa_attention_sink_bias (default true on a windowed PaddleFleet config).
            Folds into Qwen3 with sinks (model_type qwen3_sinks), which stock Qwen3 runtimes cannot serve. Default
            False.

    Upstream PaddleFleet's names are read too (use_vha_attention, vha_q_lora_rank, vha_postmix_rank, vha_shared_kv,
    gated_attention, sliding_window + window_attn_skip_freq, swa_*; and the research fork's attn_type "vha" with
    physical num_attention_heads), with upstream's defaults, and saved under ours: paddle_vha/vha/fleet_config.py.
    """

    runtime_error = VHAConfigError  # what check_runtime_support raises (paddle_vha/qwen3/runtime.py)
    # Why vha_shared_kv, sliding-window layers and sinks are refused over this base (None: they are not): their folded
    # forms (Qwen3 shared-KV, Qwen3 with sinks) exist over Qwen3 only.
    stock_fold_only: Optional[str] = None
    fused_qkv_reason = ": q_proj emits H_p*r features, which the fused [q|k|v] layout cannot express"
    tensor_parallel_reason = (" (fleet's mp layers would split q_proj, Premix and Postmix as if they were stock "
                              "heads)")

    def __init__(
        self,
        vha_q_head_dim: int | None = None,
        vha_postmix_rank: Optional[int] = None,
        vha_gated_attention: bool = False,
        vha_premix_init_alpha: float = 0.1,
        vha_postmix_u_init_std: float = 0.01,
        vha_postmix_v_init_std: float = 0.0,
        vha_fused_prologue: bool | None = None,
        vha_shared_kv: bool = False,
        vha_postmix_form: str = "auto",
        vha_window_q_head_dim: Optional[int] = None,
        vha_window_postmix_rank: Optional[int] = None,
        vha_window_num_attention_heads: Optional[int] = None,
        vha_window_num_key_value_heads: Optional[int] = None,
        vha_window_head_dim: Optional[int] = None,
        vha_window_rope_theta: Optional[float] = None,
        vha_premix: Optional[bool] = None,
        window_attention_sinks: Optional[bool] = None,
        **kwargs,
    ):
        ours = dict(vha_premix=vha_premix, vha_q_head_dim=vha_q_head_dim, vha_postmix_rank=vha_postmix_rank,
                    vha_gated_attention=None if vha_gated_attention is False else vha_gated_attention, vha_window_q_head_dim=vha_window_q_head_dim,
                    vha_window_postmix_rank=vha_window_postmix_rank,
                    vha_window_num_attention_heads=vha_window_num_attention_heads,
                    vha_window_num_key_value_heads=vha_window_num_key_value_heads,
                    vha_window_head_dim=vha_window_head_dim, vha_window_rope_theta=vha_window_rope_theta,
                    window_attention_sinks=window_attention_sinks)
        try:  # upstream PaddleFleet names (use_vha_attention, vha_q_lora_rank, swa_*, ...) -> ours
            ours, kwargs = fleet_config.translate(ours, kwargs, _defaults_of(_parent_config(type(self))).get)
        except ValueError as e:
            raise VHAConfigError(str(e)) from None
        super().__init__(**kwargs)
        vha_q_head_dim, vha_postmix_rank = ours["vha_q_head_dim"], ours["vha_postmix_rank"]
        vha_gated_attention = False if ours["vha_gated_attention"] is None else ours["vha_gated_attention"]
        vha_window_q_head_dim, vha_window_postmix_rank = ours["vha_window_q_head_dim"], ours["vha_window_postmix_rank"]
        vha_window_num_attention_heads = ours["vha_window_num_attention_heads"]
        vha_window_num_key_value_heads = ours["vha_window_num_key_value_heads"]
        vha_window_head_dim, vha_window_rope_theta = ours["vha_window_head_dim"], ours["vha_window_rope_theta"]
        self.vha_premix = True if ours["vha_premix"] is None else ours["vha_premix"]
        self.window_attention_sinks = False if ours["window_attention_sinks"] is None else ours["window_attention_sinks"]
        self.vha_q_head_dim = self.head_dim if vha_q_head_dim is None else vha_q_head_dim
        self.vha_postmix_rank = DEFAULT_POSTMIX_RANK if vha_postmix_rank is None else vha_postmix_rank
        self.vha_gated_attention = vha_gated_attention
        self.vha_premix_init_alpha = vha_premix_init_alpha
        self.vha_postmix_u_init_std = vha_postmix_u_init_std
        self.vha_postmix_v_init_std = vha_postmix_v_init_std
        self.vha_fused_prologue = vha_fused_prologue
        self.vha_shared_kv = vha_shared_kv
        self.vha_postmix_form = vha_postmix_form
        self.vha_window_q_head_dim = vha_window_q_head_dim
        self.vha_window_postmix_rank = vha_window_postmix_rank
        self.vha_window_num_attention_heads = vha_window_num_attention_heads
        self.vha_window_num_key_value_heads = vha_window_num_key_value_heads
        self.vha_window_head_dim = vha_window_head_dim
        self.vha_window_rope_theta = vha_window_rope_theta
        self.validate_vha()

    # Derived sizes, named as in the docs.
    @property
    def num_physical_heads(self) -> int:
        """H_p = H_v / H_kv: physical query heads produced by q_proj (H_v without Premix)."""
        return self.full_dims().num_physical_heads

    def window_layers(self) -> List[int]:
        """Indices of the sliding-window layers (Qwen3's layer_types with a sliding_window)."""
        if not getattr(self, "sliding_window", None):
            return []
        return [i for i, t in enumerate(getattr(self, "layer_types", None) or []) if t == "sliding_attention"]

    def full_dims(self) -> LayerDims:
        """The attention sizes of the full-attention layers (the usual config fields)."""
        return LayerDims(None, self.num_attention_heads, self.num_key_value_heads, self.head_dim, self.vha_q_head_dim,
                         self.vha_postmix_rank, _rope_theta(self), self.vha_premix)

    def layer_dims(self, layer_idx: int) -> LayerDims:
        """The attention sizes of decoder layer `layer_idx` (window layers: the vha_window_* values where set)."""
        full = self.full_dims()
        if layer_idx not in self.window_layers():
            return full
        pick = lambda v, default: default if v is None else v  # noqa: E731
        d = pick(self.vha_window_head_dim, full.head_dim)
        r_default = full.q_head_dim if d == full.head_dim else d  # a new head width: r = d unless stated
        return LayerDims(self.sliding_window, pick(self.vha_window_num_attention_heads, full.num_heads),
                         pick(self.vha_window_num_key_value_heads, full.num_kv_heads), d,
                         pick(self.vha_window_q_head_dim, r_default), pick(self.vha_window_postmix_rank, full.postmix_rank),
                         pick(self.vha_window_rope_theta, full.rope_theta), full.premix)

    def has_sinks(self, layer_idx: int) -> bool:
        """Whether decoder layer `layer_idx` has a learned sink logit per head (a window layer, window_attention_sinks)."""
        return bool(self.window_attention_sinks) and layer_idx in self.window_layers()

    def stock_shaped_window_layers(self) -> bool:
        """Whether the window layers have the full layers' head counts, head width and RoPE base (their r and R may
        differ: both fold away), so the model has a stock-Qwen3 form."""
        return all(getattr(self, f) in (None, getattr(self, f.replace("vha_window_", ""), None)) for f in _WINDOW_FIELDS
                   if f != "vha_window_rope_theta") and self.vha_window_rope_theta in (None, _rope_theta(self))

    def for_layer(self, layer_idx: int) -> "Qwen3VHAConfig":
        """This config, or a copy with layer `layer_idx`'s own sizes in the usual fields (what its attention builds
        from)."""
        dims = self.layer_dims(layer_idx)
        if (dims.num_heads, dims.num_kv_heads, dims.head_dim, dims.q_head_dim, dims.postmix_rank) == (
                self.num_attention_heads, self.num_key_value_heads, self.head_dim, self.vha_q_head_dim,
                self.vha_postmix_rank):
            return self
        cfg = copy.copy(self)
        cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim = dims.num_heads, dims.num_kv_heads, dims.head_dim
        cfg.vha_q_head_dim, cfg.vha_postmix_rank = dims.q_head_dim, dims.postmix_rank
        return cfg

    def validate_vha(self) -> None:
        """Raise VHAConfigError (one line naming the field) if the VHA fields are inconsistent."""
        for name in _WINDOW_FIELDS + ("vha_window_q_head_dim", "vha_window_postmix_rank"):
            v = getattr(self, name)
            number = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0
            if v is not None and not (number if name == "vha_window_rope_theta" else _is_int(v) and v >= 1):
                raise VHAConfigError(f"{name} must be None or a positive {'number' if 'theta' in name else 'int'}, "
                                     f"got {v!r}")
        types = getattr(self, "layer_types", None) or []
        window = getattr(self, "sliding_window", None)
        if "sliding_attention" in types and not (_is_int(window) and window >= 1):
            raise VHAConfigError(f"layer_types names sliding_attention layers but sliding_window is {window!r} (set "
                                 "use_sliding_window=true and sliding_window to a positive int)")
        set_window = [n for n in _WINDOW_FIELDS + ("vha_window_q_head_dim", "vha_window_postmix_rank")
                      if getattr(self, n) is not None]
        if set_window and not self.window_layers():
            raise VHAConfigError(f"{set_window[0]} is set but no layer is a sliding-window layer (sliding_window and "
                                 "layer_types)")
        self._check_dims(self.full_dims(), "")
        for i in self.window_layers()[:1]:  # window layers share their sizes
            self._check_dims(self.layer_dims(i), "vha_window_")
        self._check_options()

    @staticmethod
    def _check_dims(dims: LayerDims, prefix: str) -> None:
        h_v, h_kv, d, r, rank = dims.num_heads, dims.num_kv_heads, dims.head_dim, dims.q_head_dim, dims.postmix_rank
        where = " (window layers)" if prefix else ""
        checks = [
            (_is_int(h_kv) and h_kv >= 1, f"{prefix}num_key_value_heads must be a positive int, got {h_kv!r}"),
            (_is_int(h_v) and h_v >= 1, f"{prefix}num_attention_heads must be a positive int, got {h_v!r}"),
            (_is_int(d) and d >= 2 and d % 2 == 0, f"{prefix}head_dim must be a positive even int (RoPE), got {d!r}"),
        ]
        for ok, msg in checks:
            if not ok:
                raise VHAConfigError(msg)
        if h_v % h_kv != 0:
            raise VHAConfigError(
                f"{prefix}num_attention_heads (virtual heads H_v={h_v}) must be divisible by "
                f"{prefix}num_key_value_heads (H_kv={h_kv}){where}; H_p = H_v / H_kv physical heads per group"
            )
        if not (_is_int(r) and 1 <= r <= d):
            raise VHAConfigError(f"{prefix or 'vha_'}q_head_dim (r) must be an int with 1 <= r <= head_dim={d}{where}, "
                                 f"got {r!r}")
        if not (_is_int(rank) and rank >= 1):
            raise VHAConfigError(f"{prefix or 'vha_'}postmix_rank must be an int >= 1{where}, got {rank!r}")

    def _check_base_options(self) -> None:
        """The options whose folded forms this base does not have, refused in one line (stock_fold_only)."""
        if self.stock_fold_only is None:
            return
        used = [name for name, on in (("vha_shared_kv=true", self.vha_shared_kv is True),
                                      ("sliding-window layers (layer_types)", bool(self.window_layers())),
                                      ("window_attention_sinks=true", self.window_attention_sinks is True)) if on]
        if used:
            raise VHAConfigError(f"{used[0]}: {self.stock_fold_only}")

    def _check_premix(self) -> None:
        """vha_premix is a bool; without Premix the physical query heads are the virtual ones, of width d (r = d)."""
        if not isinstance(self.vha_premix, bool):
            raise VHAConfigError(f"vha_premix must be a bool, got {self.vha_premix!r}")
        if self.vha_premix:
            return
        if getattr(self, "vha_fused_prologue", None) is True:
            raise VHAConfigError("vha_fused_prologue=true with vha_premix=false: the fused operator is Premix + q/k "
                                 "RMSNorm + RoPE; without Premix the layer runs Qwen3's own norms and RoPE")
        for i in [None] + self.window_layers()[:1]:
            dims = self.full_dims() if i is None else self.layer_dims(i)
            if dims.q_head_dim != dims.head_dim:
                name = "vha_window_q_head_dim" if i is not None else "vha_q_head_dim"
                raise VHAConfigError(f"{name}={dims.q_head_dim} with vha_premix=false: without Premix the query heads "
                                     f"are as wide as the keys (head_dim={dims.head_dim})")

    def _check_options(self) -> None:
        self._check_premix()
        self._check_base_options()
        if not isinstance(self.vha_gated_attention, bool):
            raise VHAConfigError(f"vha_gated_attention must be a bool, got {self.vha_gated_attention!r}")
        for name in ("vha_premix_init_alpha", "vha_postmix_u_init_std", "vha_postmix_v_init_std"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0):
                raise VHAConfigError(f"{name} must be a finite number >= 0, got {v!r}")
        if not isinstance(self.vha_shared_kv, bool):
            raise VHAConfigError(f"vha_shared_kv must be a bool, got {self.vha_shared_kv!r}")
        softmax = getattr(self, "softmax_type", None)  # PaddleFormers' field (for PaddleFleet), upstream's sinks
        if softmax not in (None, "vanilla"):
            raise VHAConfigError(f"softmax_type={softmax!r}: a sink on every layer is not supported, only 'vanilla' "
                                 "(sinks on the sliding-window layers: window_attention_sinks)")
        if not isinstance(self.window_attention_sinks, bool):
            raise VHAConfigError(f"window_attention_sinks must be a bool, got {self.window_attention_sinks!r}")
        if self.window_attention_sinks and not self.window_layers():
            raise VHAConfigError("window_attention_sinks is set but no layer is a sliding-window layer (sliding_window "
                                 "and layer_types)")
        if self.vha_postmix_form not in postmix_form.FORMS:
            raise VHAConfigError(f"vha_postmix_form must be one of {', '.join(postmix_form.FORMS)}, got "
                                 f"{self.vha_postmix_form!r}")
        fused = getattr(self, "vha_fused_prologue", None)
        if fused is not None and not isinstance(fused, bool):
            raise VHAConfigError(f"vha_fused_prologue must be None (auto), True or False, got {fused!r}")


class Qwen3VHAConfig(VHAConfigMixin, RuntimeSupport, Qwen3Config):
    """Configuration of a Qwen3-VHA model: Qwen3Config plus the VHA fields (VHAConfigMixin)."""

    model_type = "qwen3_vha"
    runtime_label, causal_lm_name = "Qwen3-VHA", "Qwen3VHAForCausalLM"
