"""Qwen3VHAConfig: PaddleFormers' Qwen3Config plus the Virtual Head Attention fields.

Notation used throughout the package (see docs/method.md):
    h     hidden_size
    d     head_dim                          width of a virtual query / key / value head
    H_kv  num_key_value_heads               KV heads (what the cache stores)
    H_v   num_attention_heads               virtual query heads (what attention sees)
    H_p   H_v // H_kv                       physical query heads (what q_proj emits)
    r     vha_q_head_dim (default d)        width of a physical query head
    R     vha_postmix_rank                  rank of the Postmix head-mixing term
"""
from __future__ import annotations

import math

from paddleformers.transformers import Qwen3Config

__all__ = ["Qwen3VHAConfig", "VHAConfigError"]


class VHAConfigError(ValueError):
    """A Qwen3-VHA configuration that cannot describe a valid model."""


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


class Qwen3VHAConfig(Qwen3Config):
    r"""Configuration of a Qwen3-VHA model.

    Everything Qwen3Config accepts, plus:

    Args:
        vha_q_head_dim (int, optional): width r of a physical query head, 1 <= r <= head_dim.
            Defaults to head_dim.
        vha_postmix_rank (int): rank R of Postmix, M = I + V U^T with U, V of shape [H_v, R]. Default 4.
        vha_gated_attention (bool): sigmoid output gate after Postmix (blocks the Postmix fold). Default False.
        vha_premix_init_alpha (float): Premix starts at I + alpha/sqrt(d) * N(0, 1). Default 0.1.
        vha_postmix_u_init_std (float): U ~ N(0, std). Default 0.01.
        vha_postmix_v_init_std (float): V ~ N(0, std); 0 makes Postmix the identity at step 0. Default 0.0.
        vha_fused_prologue (bool or None): fused Premix + q/k RMSNorm + RoPE operator (ops/, docs/prologue.md).
            None (default): use it when it builds and loads, else the composed path with one logged line;
            True: require it; False: always the composed path.
        vha_shared_kv (bool): one projection `shared_kv_proj` (hidden -> H_kv*d) replaces k_proj and v_proj; after
            k_norm and RoPE it is both the keys and the values, and the attention output is rotated back (inverse
            RoPE at the query's position) before Postmix. The cache holds one tensor per layer. Default False.
    """

    model_type = "qwen3_vha"

    def __init__(
        self,
        vha_q_head_dim: int | None = None,
        vha_postmix_rank: int = 4,
        vha_gated_attention: bool = False,
        vha_premix_init_alpha: float = 0.1,
        vha_postmix_u_init_std: float = 0.01,
        vha_postmix_v_init_std: float = 0.0,
        vha_fused_prologue: bool | None = None,
        vha_shared_kv: bool = False,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.vha_q_head_dim = self.head_dim if vha_q_head_dim is None else vha_q_head_dim
        self.vha_postmix_rank = vha_postmix_rank
        self.vha_gated_attention = vha_gated_attention
        self.vha_premix_init_alpha = vha_premix_init_alpha
        self.vha_postmix_u_init_std = vha_postmix_u_init_std
        self.vha_postmix_v_init_std = vha_postmix_v_init_std
        self.vha_fused_prologue = vha_fused_prologue
        self.vha_shared_kv = vha_shared_kv
        self.validate_vha()

    # Derived sizes, named as in the docs.
    @property
    def num_physical_heads(self) -> int:
        """H_p = H_v / H_kv: physical query heads produced by q_proj."""
        return self.num_attention_heads // self.num_key_value_heads

    def validate_vha(self) -> None:
        """Raise VHAConfigError (one line naming the field) if the VHA fields are inconsistent."""
        h_v, h_kv, d = self.num_attention_heads, self.num_key_value_heads, self.head_dim
        checks = [
            (_is_int(h_kv) and h_kv >= 1, f"num_key_value_heads must be a positive int, got {h_kv!r}"),
            (_is_int(h_v) and h_v >= 1, f"num_attention_heads must be a positive int, got {h_v!r}"),
            (_is_int(d) and d >= 2 and d % 2 == 0, f"head_dim must be a positive even int (RoPE), got {d!r}"),
        ]
        for ok, msg in checks:
            if not ok:
                raise VHAConfigError(msg)
        if h_v % h_kv != 0:
            raise VHAConfigError(
                f"num_attention_heads (virtual heads H_v={h_v}) must be divisible by "
                f"num_key_value_heads (H_kv={h_kv}); H_p = H_v / H_kv physical heads per group"
            )
        r = self.vha_q_head_dim
        if not (_is_int(r) and 1 <= r <= d):
            raise VHAConfigError(f"vha_q_head_dim (r) must be an int with 1 <= r <= head_dim={d}, got {r!r}")
        rank = self.vha_postmix_rank
        if not (_is_int(rank) and rank >= 1):
            raise VHAConfigError(f"vha_postmix_rank must be an int >= 1, got {rank!r}")
        if not isinstance(self.vha_gated_attention, bool):
            raise VHAConfigError(f"vha_gated_attention must be a bool, got {self.vha_gated_attention!r}")
        for name in ("vha_premix_init_alpha", "vha_postmix_u_init_std", "vha_postmix_v_init_std"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0):
                raise VHAConfigError(f"{name} must be a finite number >= 0, got {v!r}")
        if not isinstance(self.vha_shared_kv, bool):
            raise VHAConfigError(f"vha_shared_kv must be a bool, got {self.vha_shared_kv!r}")
        fused = getattr(self, "vha_fused_prologue", None)
        if fused is not None and not isinstance(fused, bool):
            raise VHAConfigError(f"vha_fused_prologue must be None (auto), True or False, got {fused!r}")

    def check_runtime_support(self, tensor_parallel_plan: bool = False) -> None:
        """Raise VHAConfigError for runtime options (set by trainers after construction) VHA does not support.

        tensor_parallel_plan: the caller builds the model through paddle_vha.parallel (build_tensor_parallel_model),
        which accepts tensor_model_parallel_size > 1; the model classes alone build single-device layers only.
        """
        if self.fuse_attention_qkv:
            raise VHAConfigError(
                "fuse_attention_qkv=True is not supported by Qwen3-VHA: q_proj emits H_p*r features, "
                "which the fused [q|k|v] layout cannot express; set fuse_attention_qkv=False"
            )
        if self.tensor_model_parallel_size > 1 and not tensor_parallel_plan:
            raise VHAConfigError(
                f"tensor_model_parallel_size={self.tensor_model_parallel_size}: Qwen3-VHA is tensor-parallel only "
                "through paddle_vha.parallel (fleet's mp layers would split q_proj, Premix and Postmix as if they "
                "were stock heads): build with paddle_vha.parallel.build_tensor_parallel_model(Qwen3VHAForCausalLM, "
                "config, group), see docs/tensor_parallel.md"
            )
        if self.sequence_parallel:
            raise VHAConfigError("sequence_parallel=True is not supported by Qwen3-VHA")
