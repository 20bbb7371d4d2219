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

from dataclasses import dataclass
from typing import Dict, Tuple

from .plan import TPPlanError, TensorShard, _cfg, mlp_shards

__all__ = ["HeadLayout", "gqa_layout", "check_mea_plan", "mea_layer_layout", "mea_layer_shards", "mea_layer_kind"]


@dataclass(frozen=True)
class HeadLayout:
    """What rank `rank` of `t` computes in one GQA-shaped attention layer (MEA: the KV heads are the virtual ones)."""

    t: int
    rank: int
    heads: Tuple[int, int]  # query heads [a, b)
    kv: Tuple[int, int]  # KV heads [a, b) this rank reads (MEA: virtual heads, i.e. columns of the HLC matrices)
    kv_sharded: bool  # t <= n_kv: KV heads split; else replicated (whole tensors, rank-local slice)

    @property
    def num_heads(self) -> int:
        return self.heads[1] - self.heads[0]

    @property
    def num_kv_heads(self) -> int:
        return self.kv[1] - self.kv[0]


def _check_gqa(h: int, n_kv: int, t: int, what: str) -> None:
    if h % t:
        raise TPPlanError(f"num_attention_heads={h} must be divisible by the tensor-parallel size t={t}")
    if t <= n_kv and n_kv % t:
        raise TPPlanError(f"{what}={n_kv} must be divisible by t={t} (KV heads are split when t <= {what})")
    if t > n_kv and t % n_kv:
        raise TPPlanError(f"t={t} > {what}={n_kv}: t must be a multiple of {what} (each KV head is replicated on "
                          f"t/{what} ranks)")


def gqa_layout(h: int, n_kv: int, t: int, rank: int) -> HeadLayout:
    """Query heads [rank*h/t, ...) and the KV heads they read (query head i reads KV head i // (h/n_kv))."""
    _check_gqa(h, n_kv, t, "KV heads")
    per = h // t
    heads = (rank * per, (rank + 1) * per)
    if t <= n_kv:
        g = n_kv // t
        return HeadLayout(t, rank, heads, (rank * g, (rank + 1) * g), kv_sharded=True)
    g = rank // (t // n_kv)
    return HeadLayout(t, rank, heads, (g, g + 1), kv_sharded=False)


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
    if not (isinstance(t, int) and t >= 1):
        raise TPPlanError(f"tensor-parallel size must be an int >= 1, got {t!r}")
    h = _cfg(cfg, "num_attention_heads")
    kinds = {mea_layer_kind(cfg, i) for i in range(_cfg(cfg, "num_hidden_layers"))}
    for kind in sorted(kinds):
        n_kv, what = _kv_heads(cfg, kind)
        _check_gqa(h, n_kv, t, what)
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
