"""Tensor-parallel plan of Qwen3 shared-KV: the stock GQA plan (paddle_vha/qwen3/tp_plan.py) with shared_kv_proj split
(or replicated) as the keys are. Pure arithmetic on the config, as data."""
from __future__ import annotations

from ..parallel.plan import LayerPlan, TPPlanError, check_head_split, check_size, gqa_layout, mlp_shards
from ..qwen3.tp_plan import stock_layer_plan

__all__ = ["check", "layer_plan", "TPPlanError"]


def check(cfg, t: int) -> None:
    check_size(t)
    h, n_kv = cfg.num_attention_heads, cfg.num_key_value_heads
    check_head_split(h, n_kv, t, f"num_attention_heads={h}", f"num_key_value_heads={n_kv}", "num_key_value_heads")
    mlp_shards(cfg, t)


def layer_plan(cfg, t: int, rank: int, layer_idx: int) -> LayerPlan:
    check(cfg, t)
    return stock_layer_plan(cfg, t, gqa_layout(cfg.num_attention_heads, cfg.num_key_value_heads, t, rank),
                            kv_projections=("shared_kv_proj",))
