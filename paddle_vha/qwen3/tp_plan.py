"""Tensor-parallel plan of a stock Qwen3 (GQA) decoder layer, as Megatron splits it; used for stock Qwen3 shared-KV
and for the layers Qwen3-MEA leaves alone. Pure arithmetic on the config, as data (paddle_vha/spec/sharding.py); the
tensors' shards are declared in paddle_vha/qwen3/spec.py.

Rank k of t: query heads [k*H/t, (k+1)*H/t); `k_proj` / `v_proj` split by KV head when t <= n_kv, else whole with
the rank computing KV head k // (t/n_kv) (its columns of the whole Linear).
"""
from __future__ import annotations

from ..spec.params import ModelSpec
from ..spec.sharding import HeadLayout, LayerPlan, check_head_split, check_mlp_split, check_size, gqa_layout
from .spec import QWEN3

__all__ = ["gqa_attention_attributes", "stock_layer_plan", "GQAPlan"]


def gqa_attention_attributes(lay: HeadLayout) -> dict:
    """The local head counts a Qwen3 attention reads in its forward."""
    groups = lay.num_heads // lay.num_kv_heads
    return dict(num_heads=lay.num_heads, num_key_value_groups=groups, gqa_or_mqa=groups != 1)


def stock_layer_plan(cfg, layer_idx: int, lay: HeadLayout, spec: ModelSpec = QWEN3,
                     kv_projections=("k_proj", "v_proj")) -> LayerPlan:
    """Stock GQA decoder layer `layer_idx` split by the layout `lay` (query and KV heads of this rank)."""
    d = cfg.head_dim
    attrs = dict(gqa_attention_attributes(lay), num_key_value_heads=lay.num_kv_heads)
    columns = {}
    if not lay.kv_sharded:  # K/V stay whole; this rank computes its KV head only
        columns = {f"self_attn.{name}": (lay.kv[0] * d, lay.kv[1] * d) for name in kv_projections}
    return LayerPlan(params=spec.layer_shards(cfg, layer_idx, lay), column_slices=columns,
                     attributes={"self_attn": attrs})


class GQAPlan:
    """The tensor-parallel plan of a family whose layers are all GQA-shaped (H query heads over H_kv KV heads): heads
    split as above, every tensor as the family's spec declares. What the registry's `tp_plan` asks for: check(cfg, t)
    and layer_plan(cfg, t, rank, i)."""

    def __init__(self, spec: ModelSpec, kv_projections=("k_proj", "v_proj")):
        self.spec, self.kv_projections = spec, tuple(kv_projections)

    def check(self, cfg, t: int) -> None:
        check_size(t)
        h, n_kv = cfg.num_attention_heads, cfg.num_key_value_heads
        check_head_split(h, n_kv, t, f"num_attention_heads={h}", f"num_key_value_heads={n_kv}", "num_key_value_heads")
        check_mlp_split(cfg, t)

    def layer_plan(self, cfg, t: int, rank: int, layer_idx: int) -> LayerPlan:
        self.check(cfg, t)
        lay = gqa_layout(cfg.num_attention_heads, cfg.num_key_value_heads, t, rank)
        return stock_layer_plan(cfg, layer_idx, lay, spec=self.spec, kv_projections=self.kv_projections)
