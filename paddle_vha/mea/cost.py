"""Qwen3-MEA in the cost model (paddle_vha/spec/cost.py): its formulas and the Arch fields of its attention.

An MEA layer caches n_p = num_kv_heads physical heads and composes n_v = mea_kv_heads virtual ones from them (the HLC
coefficients mea_k_lc, mea_v_lc [n_p, n_v]; K and V each cost 2 n_p n_v d FLOPs per token), with an optional head norm;
the layers outside mea_layers are stock GQA with mea_stock_kv_heads (default n_v) KV heads.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

from ..spec.cost import Arch, ArchError, AttentionCost
from .layers import count_mea_layers
from .spec import HLC_PART

__all__ = ["MEA", "arch_fields"]


class MEACost(AttentionCost):
    kind = "mea"
    windows = False

    def validate(self, a: Arch) -> None:
        # not GQA's "num_heads a multiple of num_kv_heads": the queries group by the n_v virtual heads HLC composes,
        # so n_p physical heads need not divide them (--kv-heads 4 of 6 was an ArchError traceback here)
        if not (isinstance(a.num_kv_heads, int) and a.num_kv_heads >= 1):
            raise ArchError(f"{a.label}: num_kv_heads must be a positive int, got {a.num_kv_heads!r}")
        if a.mea_kv_heads < a.num_kv_heads or a.num_heads % a.mea_kv_heads:
            raise ArchError(f"{a.label}: MEA needs num_kv_heads (n_p) <= mea_kv_heads (n_v) and num_heads "
                            f"a multiple of n_v, got n_p={a.num_kv_heads}, n_v={a.mea_kv_heads}, "
                            f"num_heads={a.num_heads}")
        if a.mea_num_layers is not None and not 0 <= a.mea_num_layers <= a.num_layers:
            raise ArchError(f"{a.label}: mea_num_layers={a.mea_num_layers} not in [0, {a.num_layers}]")

    def layers(self, a: Arch) -> List[Tuple[Arch, int, Optional[int]]]:
        """The MEA layers, then the stock ones: GQA with their own KV heads (n_v unless stated)."""
        n_mea = a.num_layers if a.mea_num_layers is None else a.mea_num_layers
        stock = a.replace(kind="gqa", num_kv_heads=a.mea_stock_kv_heads or a.mea_kv_heads)
        return [(a, n_mea, None), (stock, a.num_layers - n_mea, None)]

    def weights(self, a: Arch) -> Dict[str, int]:
        parts = super().weights(a)
        parts[HLC_PART] = 2 * a.num_kv_heads * a.mea_kv_heads  # mea_k_lc, mea_v_lc: [n_p, n_v]
        return parts

    def biases_and_norms(self, a: Arch, parts: Dict[str, int]) -> Dict[str, int]:
        parts = super().biases_and_norms(a, parts)
        if a.mea_group_norm:
            parts["mea_norm"] = a.num_heads * a.head_dim
        return parts

    def cache_description(self, a: Arch) -> str:
        return f"{a.num_kv_heads} KV heads (-> {a.mea_kv_heads} virtual)"

    def part_flops(self, a: Arch, name: str, n: int) -> float:
        if name == HLC_PART:  # K and V: n_v virtual heads from n_p physical ones
            return 2 * 2 * a.num_kv_heads * a.mea_kv_heads * a.head_dim
        return super().part_flops(a, name, n)


MEA = MEACost()


def arch_fields(cfg: dict, common: dict) -> dict:
    """n_p cached heads composed into n_v virtual ones in the MEA layers; the other layers keep n_s stock KV heads."""
    n_kv = cfg.get("num_key_value_heads") or common["num_heads"]
    layers = cfg.get("mea_layers")
    return dict(kind="mea", num_kv_heads=n_kv, mea_kv_heads=cfg.get("mea_kv_heads") or n_kv,
                mea_num_layers=None if layers in (None, "all") else count_mea_layers(layers, common["num_layers"]),
                mea_group_norm=bool(cfg.get("mea_group_norm", True)), mea_stock_kv_heads=cfg.get("mea_stock_kv_heads"))
