"""Tensor-parallel plan for Qwen3-MEA: per layer, which slice of which tensor each rank holds.

Pure arithmetic on the config (no Paddle), like plan.py for Qwen3-VHA. Notation of docs/mea.md: H query heads,
n_p physical (cached) KV heads, n_v virtual KV heads, n_s KV heads of the stock layers, t the tensor-parallel size.

An MEA layer is GQA over its n_v virtual KV heads, and every virtual head is a mix of *all* n_p physical heads
(K_v[j] = sum_p K_p[p] * lc[p, j]). So, rank k of t:

* query heads [k*H/t, (k+1)*H/t): a contiguous block; `q_proj` is column-parallel (its bias and `mea_norm.weight`
  follow the heads), `o_proj` row-parallel, exactly as stock Qwen3;
* virtual KV heads: t <= n_v (n_v % t == 0): rank k owns virtual heads [k*n_v/t, (k+1)*n_v/t), i.e. those columns of
  `mea_k_lc` / `mea_v_lc`; t > n_v (t % n_v == 0, as Megatron replicates KV heads when groups < t): c = t/n_v ranks
  share virtual head g = k // c; the HLC matrices stay whole (gradient summed) and the rank reads column g;
* physical heads: `k_proj` / `v_proj` stay whole and every rank computes all n_p heads (gradient summed). They are
  the compressed cache itself (n_p is small, 1-2 heads in the paper's settings), every virtual head needs all of
  them, and splitting them would cost an all-gather of n_p*d per token per layer instead of nothing. Each rank
  therefore caches the n_p physical heads, which is what a stock GQA model with fewer KV heads than ranks does too;
* `q_norm`, `k_norm`: whole, gradient summed (each rank normalizes its own heads).

A stock layer of an MEA model (not in `mea_layers`, n_s KV heads) is Qwen3 GQA: query heads as above, `k_proj` /
`v_proj` split by KV head when t <= n_s, else whole with the rank computing KV head k // (t/n_s) (gradient summed).

MLP, embedding, norms and lm_head as the Qwen3-VHA plan (plan.py). Every tensor is either split disjointly over all
t ranks along one axis or whole on every rank: the sharded save / merge of checkpoint.py needs nothing else.
"""
from __future__ import annotations

from typing import Dict, Tuple

from .plan import HeadLayout, TensorShard, _cfg, check_head_split, check_size, gqa_layout, mlp_shards

__all__ = ["check_mea_plan", "mea_layer_layout", "mea_layer_shards", "mea_layer_kind"]


def mea_layer_kind(cfg, layer_idx: int) -> str:
    """'mea' for a layer in mea_layers (None: all), else 'stock'."""
    layers = _cfg(cfg, "mea_layers")
    return "mea" if layers is None or layer_idx in layers else "stock"


def _kv_heads(cfg, kind: str) -> Tuple[int, str]:
    if kind == "mea":
        return _cfg(cfg, "mea_kv_heads"), "mea_kv_heads"
    return _cfg(cfg, "mea_stock_kv_heads"), "mea_stock_kv_heads"


def check_mea_plan(cfg, t: int) -> None:
    """TPPlanError (one line) if the Qwen3-MEA config cannot be sharded over t ranks."""
    check_size(t)
    h = _cfg(cfg, "num_attention_heads")
    kinds = {mea_layer_kind(cfg, i) for i in range(_cfg(cfg, "num_hidden_layers"))}
    for kind in sorted(kinds):
        n_kv, what = _kv_heads(cfg, kind)
        check_head_split(h, n_kv, t, f"num_attention_heads={h}", f"{what}={n_kv}", what)
    mlp_shards(cfg, t)  # the MLP's own conditions


def mea_layer_layout(cfg, t: int, rank: int, layer_idx: int) -> HeadLayout:
    check_mea_plan(cfg, t)
    n_kv, _ = _kv_heads(cfg, mea_layer_kind(cfg, layer_idx))
    return gqa_layout(_cfg(cfg, "num_attention_heads"), n_kv, t, rank)


def mea_layer_shards(cfg, t: int, layer_idx: int) -> Dict[str, TensorShard]:
    """Parameter name suffix (relative to decoder layer `layer_idx`) -> shard; names not listed stay whole."""
    check_mea_plan(cfg, t)
    kind = mea_layer_kind(cfg, layer_idx)
    n_kv, _ = _kv_heads(cfg, kind)
    kv_split = t <= n_kv
    rep_sum = TensorShard(None, grad_sum=True)
    a = "self_attn."
    shards = {
        a + "q_proj.weight": TensorShard(1),  # column-parallel by query head ([in, out] in memory)
        a + "q_proj.bias": TensorShard(0),
        a + "q_norm.weight": rep_sum,
        a + "k_norm.weight": rep_sum,
        a + "o_proj.weight": TensorShard(0),  # row-parallel
        a + "o_proj.bias": TensorShard(None),  # added after the all-reduce: full gradient on every rank
    }
    if kind == "mea":
        shards.update({
            a + "k_proj.weight": rep_sum,  # all n_p physical heads on every rank (the cached ones)
            a + "k_proj.bias": rep_sum,
            a + "v_proj.weight": rep_sum,
            a + "v_proj.bias": rep_sum,
            a + "mea_k_lc": TensorShard(1) if kv_split else rep_sum,  # [n_p, n_v]: columns = virtual heads
            a + "mea_v_lc": TensorShard(1) if kv_split else rep_sum,
            a + "mea_norm.weight": TensorShard(0),  # [H*d], by query head
        })
    else:
        shards.update({
            a + "k_proj.weight": TensorShard(1) if kv_split else rep_sum,
            a + "k_proj.bias": TensorShard(0) if kv_split else rep_sum,
            a + "v_proj.weight": TensorShard(1) if kv_split else rep_sum,
            a + "v_proj.bias": TensorShard(0) if kv_split else rep_sum,
        })
    shards.update(mlp_shards(cfg, t))
    return shards
