"""Tensor-parallel plan for Qwen3-MEA: per layer, which slice of which tensor each rank holds.

Pure arithmetic on the config (no Paddle), as data (paddle_vha/spec/sharding.py), applied by paddle_vha/parallel/apply.py.
Notation of docs/mea.md: H query heads, n_p physical (cached) KV heads, n_v virtual KV heads, n_s KV heads of the
stock layers, t the tensor-parallel size.

An MEA layer is GQA over its n_v virtual KV heads, and every virtual head is a mix of *all* n_p physical heads
(K_v[j] = sum_p K_p[p] * lc[p, j]). So, rank k of t:

* query heads [k*H/t, (k+1)*H/t): a contiguous block; `q_proj` is column-parallel (its bias and `mea_norm.weight`
  follow the heads), `o_proj` row-parallel, exactly as stock Qwen3;
* virtual KV heads: t <= n_v (n_v % t == 0): rank k owns virtual heads [k*n_v/t, (k+1)*n_v/t), i.e. those columns of
  `mea_k_lc` / `mea_v_lc`; t > n_v (t % n_v == 0, as Megatron replicates KV heads when groups < t): c = t/n_v ranks
  share virtual head g = k // c; the HLC matrices stay whole (gradient summed) and the rank reads column g through
  the layer's `hlc_coefficients()` hook;
* physical heads: `k_proj` / `v_proj` stay whole and every rank computes all n_p heads (gradient summed). They are
  the compressed cache itself (n_p is small, 1-2 heads in the paper's settings), every virtual head needs all of
  them, and splitting them would cost an all-gather of n_p*d per token per layer instead of nothing. Each rank
  therefore caches the n_p physical heads, which is what a stock GQA model with fewer KV heads than ranks does too;
* `q_norm`, `k_norm`: whole, gradient summed (each rank normalizes its own heads).

A stock layer of an MEA model (not in `mea_layers`, n_s KV heads) is Qwen3 GQA (paddle_vha/qwen3/tp_plan.py).

MLP, embedding, norms and lm_head as the Qwen3-VHA plan. No new collective: an MEA layer communicates exactly what a
stock Qwen3 layer does (the input-gradient all-reduce and o_proj's all-reduce), plus the gradient all-reduce of the
replicated k_proj / v_proj / norms once per step.
"""
from __future__ import annotations

from typing import Dict

from ..qwen3.tp_plan import gqa_attention_attributes, stock_layer_plan
from ..spec.sharding import HeadLayout, LayerPlan, TensorShard, TPPlanError, check_head_split, check_mlp_split, check_size, gqa_layout
from .layers import is_mea_layer
from ..spec.params import ModelSpec
from .spec import QWEN3_MEA

__all__ = ["check", "layer_kind", "layer_layout", "layer_shards", "layer_plan", "MEAPlan", "TPPlanError"]


def layer_kind(cfg, layer_idx: int) -> str:
    """'mea' for a layer in mea_layers (None: all), else 'stock'."""
    return "mea" if is_mea_layer(cfg.mea_layers, layer_idx) else "stock"


def _kv_heads(cfg, kind: str):
    if kind == "mea":
        return cfg.mea_kv_heads, "mea_kv_heads"
    return cfg.mea_stock_kv_heads, "mea_stock_kv_heads"


def check(cfg, t: int) -> None:
    """TPPlanError (one line) if the Qwen3-MEA config cannot be sharded over t ranks."""
    check_size(t)
    h = cfg.num_attention_heads
    kinds = {layer_kind(cfg, i) for i in range(cfg.num_hidden_layers)}
    for kind in sorted(kinds):
        n_kv, what = _kv_heads(cfg, kind)
        check_head_split(h, n_kv, t, f"num_attention_heads={h}", f"{what}={n_kv}", what)
    check_mlp_split(cfg, t)  # the MLP's own conditions


def layer_layout(cfg, t: int, rank: int, layer_idx: int) -> HeadLayout:
    check(cfg, t)
    n_kv, _ = _kv_heads(cfg, layer_kind(cfg, layer_idx))
    return gqa_layout(cfg.num_attention_heads, n_kv, t, rank)


def layer_shards(cfg, t: int, layer_idx: int, spec: ModelSpec = QWEN3_MEA) -> Dict[str, TensorShard]:
    """Parameter name (relative to decoder layer `layer_idx`) -> shard on rank 0 of t (the split is the same on every
    rank); as declared in `spec` (paddle_vha/mea/spec.py over the family's base)."""
    return spec.layer_shards(cfg, layer_idx, layer_layout(cfg, t, 0, layer_idx))


def layer_plan(cfg, t: int, rank: int, layer_idx: int, spec: ModelSpec = QWEN3_MEA) -> LayerPlan:
    lay = layer_layout(cfg, t, rank, layer_idx)
    if layer_kind(cfg, layer_idx) == "stock":
        return stock_layer_plan(cfg, layer_idx, lay, spec=spec)
    attrs = dict(gqa_attention_attributes(lay), num_virtual_heads=lay.num_kv_heads,  # the HLC columns it composes
                 hlc_columns=None if lay.kv_sharded else lay.kv)
    return LayerPlan(params=spec.layer_shards(cfg, layer_idx, lay), attributes={"self_attn": attrs})


class MEAPlan:
    """This module's plan over an MEA family's spec (MEA over another base), as the registry's `tp_plan` asks for it."""

    check = staticmethod(check)

    def __init__(self, spec: ModelSpec):
        self.spec = spec

    def layer_plan(self, cfg, t: int, rank: int, layer_idx: int) -> LayerPlan:
        return layer_plan(cfg, t, rank, layer_idx, self.spec)
