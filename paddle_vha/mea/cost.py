"""Qwen3-MEA in the cost model (paddle_vha/accounting.py): the Arch fields of its attention, from config.json."""
from __future__ import annotations

from .layers import count_mea_layers

__all__ = ["arch_fields"]


def arch_fields(cfg: dict, common: dict) -> dict:
    """n_p cached heads composed into n_v virtual ones in the MEA layers; the other layers keep n_s stock KV heads."""
    n_kv = cfg.get("num_key_value_heads") or common["num_heads"]
    layers = cfg.get("mea_layers")
    return dict(kind="mea", num_kv_heads=n_kv, mea_kv_heads=cfg.get("mea_kv_heads") or n_kv,
                mea_num_layers=None if layers in (None, "all") else count_mea_layers(layers, common["num_layers"]),
                mea_group_norm=bool(cfg.get("mea_group_norm", True)), mea_stock_kv_heads=cfg.get("mea_stock_kv_heads"))
