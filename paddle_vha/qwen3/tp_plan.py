"""Tensor-parallel plan of a stock Qwen3 (GQA) decoder layer, as Megatron splits it; used for the layers Qwen3-MEA
leaves alone (paddle_vha/mea/tp_plan.py). Pure arithmetic on the config, as data (paddle_vha/parallel/plan.py).

Rank k of t: query heads [k*H/t, (k+1)*H/t); `q_proj` column-parallel, `o_proj` row-parallel; `k_proj` / `v_proj`
split by KV head when t <= n_kv, else whole with the rank computing KV head k // (t/n_kv) (gradient summed); q_norm /
k_norm whole, gradient summed (each rank normalizes its own heads); MLP column / row-parallel.
"""
from __future__ import annotations

from ..parallel.plan import REPLICATED_SUMMED, HeadLayout, LayerPlan, TensorShard, mlp_shards

__all__ = ["gqa_attention_shards", "gqa_attention_attributes", "stock_layer_plan"]


def gqa_attention_shards(kv_split: bool, kv_projections=("k_proj", "v_proj")) -> dict:
    """Attention parameters of a GQA layer whose query heads are split by rank (its K/V projections split by KV head,
    or replicated with summed gradients)."""
    a = "self_attn."
    shards = {
        a + "q_proj.weight": TensorShard(1),  # column-parallel by query head ([in, out] in memory)
        a + "q_proj.bias": TensorShard(0),
        a + "q_norm.weight": REPLICATED_SUMMED,
        a + "k_norm.weight": REPLICATED_SUMMED,
        a + "o_proj.weight": TensorShard(0),  # row-parallel
        a + "o_proj.bias": TensorShard(None),  # added after the all-reduce: full gradient on every rank
    }
    for name in kv_projections:
        shards[a + f"{name}.weight"] = TensorShard(1) if kv_split else REPLICATED_SUMMED
        shards[a + f"{name}.bias"] = TensorShard(0) if kv_split else REPLICATED_SUMMED
    return shards


def gqa_attention_attributes(lay: HeadLayout) -> dict:
    """The local head counts a Qwen3 attention reads in its forward."""
    groups = lay.num_heads // lay.num_kv_heads
    return dict(num_heads=lay.num_heads, num_key_value_groups=groups, gqa_or_mqa=groups != 1)


def stock_layer_plan(cfg, t: int, lay: HeadLayout, kv_projections=("k_proj", "v_proj")) -> LayerPlan:
    """A stock GQA decoder layer split by the layout `lay` (query and KV heads of this rank)."""
    d = cfg.head_dim
    params = {**gqa_attention_shards(lay.kv_sharded, kv_projections), **mlp_shards(cfg, t)}
    attrs = dict(gqa_attention_attributes(lay), num_key_value_heads=lay.num_kv_heads)
    columns = {}
    if not lay.kv_sharded:  # K/V stay whole; this rank computes its KV head only
        columns = {f"self_attn.{name}": (lay.kv[0] * d, lay.kv[1] * d) for name in kv_projections}
    return LayerPlan(params=params, column_slices=columns, attributes={"self_attn": attrs})
