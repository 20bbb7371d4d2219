"""The Multi-head Explicit Attention fields over a base's config: `MEAConfigMixin` and Qwen3MEAConfig, PaddleFormers'
Qwen3Config with them (Llama-MEA and Qwen2-MEA: paddle_vha/llama/, paddle_vha/qwen2/).

Notation (docs/mea.md):
    H     num_attention_heads        query heads
    n_p   num_key_value_heads        physical KV heads of an MEA layer: what its cache stores
    n_v   mea_kv_heads               virtual KV heads composed by HLC: what attention sees (query head i reads i // (H/n_v))
    n_s   mea_stock_kv_heads         KV heads of the layers that are not MEA (stock Qwen3 attention); default n_v
"""
from __future__ import annotations

from typing import List, Optional

from paddleformers.transformers import Qwen3Config

from ..qwen3.runtime import RuntimeSupport
from .layers import MEAConfigError, is_mea_layer, parse_layer_spec

__all__ = ["Qwen3MEAConfig", "MEAConfigMixin", "MEAConfigError", "K_NORM_POSITIONS", "parse_layer_spec"]

K_NORM_POSITIONS = ("after_hlc", "before_hlc")


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


class MEAConfigMixin:
    r"""The MEA fields, put before RuntimeSupport and a base's config class.

    Everything the base's config accepts (`num_key_value_heads` is n_p, the physical KV heads of MEA layers), plus:

    Args:
        mea_kv_heads (int, optional): n_v virtual KV heads, n_p <= n_v, dividing num_attention_heads.
            Defaults to num_key_value_heads (HLC then is a square mixing).
        mea_group_norm (bool): RMSNorm per attention-output head (learnable weight) before o_proj. Default True.
        mea_layers (list of int, optional): layers that use MEA; None means all. The others are stock Qwen3.
        mea_stock_kv_heads (int, optional): KV heads of the stock layers. Defaults to mea_kv_heads (what the
            SVD conversion needs: a compressed layer's virtual heads are the original KV heads).
        mea_k_norm_position (str): 'after_hlc' (default; k_norm and RoPE on the virtual heads, cache holds raw
            physical K) or 'before_hlc' (on the physical heads: cache holds normed, rotated K; allows the
            multi-query serving form). docs/mea.md gives the measurements behind the default. On a base without
            q/k norms (Llama, Qwen2) the two are the same function (RoPE commutes with HLC).
    """

    runtime_error = MEAConfigError  # what check_runtime_support raises (paddle_vha/qwen3/runtime.py)
    fused_qkv_reason = " (layers differ in KV heads)"
    tensor_parallel_reason = " (fleet's mp layers would split the HLC matrices' physical heads)"

    def __init__(
        self,
        mea_kv_heads: Optional[int] = None,
        mea_group_norm: bool = True,
        mea_layers: Optional[List[int]] = None,
        mea_stock_kv_heads: Optional[int] = None,
        mea_k_norm_position: str = "after_hlc",
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.mea_kv_heads = self.num_key_value_heads if mea_kv_heads is None else mea_kv_heads
        self.mea_group_norm = mea_group_norm
        self.mea_layers = None if mea_layers is None else list(mea_layers)
        self.mea_stock_kv_heads = self.mea_kv_heads if mea_stock_kv_heads is None else mea_stock_kv_heads
        self.mea_k_norm_position = mea_k_norm_position
        self.validate_mea()

    def is_mea_layer(self, layer_idx: int) -> bool:
        return is_mea_layer(self.mea_layers, layer_idx)

    @property
    def mea_layer_indices(self) -> List[int]:
        return [i for i in range(self.num_hidden_layers) if self.is_mea_layer(i)]

    def kv_heads_of_layer(self, layer_idx: int) -> int:
        """KV heads the cache stores for this layer: n_p for MEA layers, n_s for stock ones."""
        return self.num_key_value_heads if self.is_mea_layer(layer_idx) else self.mea_stock_kv_heads

    def validate_mea(self) -> None:
        """Raise MEAConfigError (one line naming the field) if the MEA fields are inconsistent."""
        H, n_p, n_v, n_s, d = (self.num_attention_heads, self.num_key_value_heads, self.mea_kv_heads,
                               self.mea_stock_kv_heads, self.head_dim)
        for name, v in (("num_attention_heads", H), ("num_key_value_heads", n_p), ("mea_kv_heads", n_v),
                        ("mea_stock_kv_heads", n_s)):
            if not (_is_int(v) and v >= 1):
                raise MEAConfigError(f"{name} must be a positive int, got {v!r}")
        if not (_is_int(d) and d >= 2 and d % 2 == 0):
            raise MEAConfigError(f"head_dim must be a positive even int (RoPE), got {d!r}")
        if n_p > n_v:
            raise MEAConfigError(
                f"num_key_value_heads (physical heads n_p={n_p}) must be <= mea_kv_heads (virtual heads n_v={n_v})")
        if H % n_v:
            raise MEAConfigError(f"num_attention_heads ({H}) must be divisible by mea_kv_heads (n_v={n_v})")
        if H % n_s:
            raise MEAConfigError(f"num_attention_heads ({H}) must be divisible by mea_stock_kv_heads ({n_s})")
        if not isinstance(self.mea_group_norm, bool):
            raise MEAConfigError(f"mea_group_norm must be a bool, got {self.mea_group_norm!r}")
        if self.mea_k_norm_position not in K_NORM_POSITIONS:
            raise MEAConfigError(
                f"mea_k_norm_position must be one of {', '.join(K_NORM_POSITIONS)}, got {self.mea_k_norm_position!r}")
        layers = self.mea_layers
        if layers is not None:
            L = self.num_hidden_layers
            if not all(_is_int(i) for i in layers) or len(set(layers)) != len(layers):
                raise MEAConfigError(f"mea_layers must be a list of distinct layer indices, got {layers!r}")
            bad = [i for i in layers if not 0 <= i < L]
            if bad:
                raise MEAConfigError(f"mea_layers {bad} outside 0..{L - 1} (num_hidden_layers={L})")
            self.mea_layers = sorted(layers)

    def check_runtime_support(self, tensor_parallel_plan: bool = False) -> None:
        """RuntimeSupport's refusals (paddle_vha/qwen3/runtime.py), and sliding-window layers."""
        super().check_runtime_support(tensor_parallel_plan)
        if getattr(self, "sliding_window", None) and "sliding_attention" in (getattr(self, "layer_types", None) or []):
            raise MEAConfigError(f"sliding-window layers are not supported by {self.runtime_label}")


class Qwen3MEAConfig(MEAConfigMixin, RuntimeSupport, Qwen3Config):
    """Configuration of a Qwen3-MEA model: Qwen3Config plus the MEA fields (MEAConfigMixin)."""

    model_type = "qwen3_mea"
    runtime_label, causal_lm_name = "Qwen3-MEA", "Qwen3MEAForCausalLM"
