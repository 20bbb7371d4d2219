"""Qwen3 shared-KV in the cost model (paddle_vha/accounting.py): GQA whose cache holds one tensor per layer."""
from __future__ import annotations

__all__ = ["arch_fields"]


def arch_fields(cfg: dict, common: dict) -> dict:
    n_kv = cfg.get("num_key_value_heads") or common["num_heads"]
    return dict(kind="mha" if n_kv == common["num_heads"] else "gqa", num_kv_heads=n_kv, shared_kv=True)
