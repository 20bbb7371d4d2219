"""Stock Qwen3 attention in the cost model (paddle_vha/spec/cost.py): MHA and GQA, and the stock GQA form a folded VHA
checkpoint is served as (its own kind so tables can tell it apart). The formulas are AttentionCost's defaults."""
from __future__ import annotations

from ..spec.cost import AttentionCost

__all__ = ["MHA", "GQA", "VHA_FOLDED", "arch_fields"]

MHA = AttentionCost("mha")
GQA = AttentionCost("gqa")
VHA_FOLDED = AttentionCost("vha_folded")


def arch_fields(cfg: dict, common: dict) -> dict:
    """A stock Qwen3 config.json: MHA when every query head has its own KV head, else GQA."""
    n_kv = cfg.get("num_key_value_heads") or common["num_heads"]
    return dict(kind="mha" if n_kv == common["num_heads"] else "gqa", num_kv_heads=n_kv)
