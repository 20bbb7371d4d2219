"""Qwen3-VHA in the cost model (paddle_vha/accounting.py): the Arch fields of its attention, from config.json."""
from __future__ import annotations

__all__ = ["arch_fields"]


def arch_fields(cfg: dict, common: dict) -> dict:
    """H_p = H_v / H_kv physical query heads of width r, Premix per group, Postmix of rank R, optional gate."""
    return dict(kind="vha", num_kv_heads=cfg.get("num_key_value_heads") or common["num_heads"],
                vha_q_head_dim=cfg.get("vha_q_head_dim") or common["head_dim"],
                vha_postmix_rank=cfg.get("vha_postmix_rank", 4), vha_gated=bool(cfg.get("vha_gated_attention", False)),
                shared_kv=bool(cfg.get("vha_shared_kv", False)))
