"""Tensor-parallel plan for Qwen3-VHA: which slice of which tensor each rank holds, and why.

Pure arithmetic on the config (no Paddle), as data (paddle_vha/spec/sharding.py), applied by paddle_vha/parallel/apply.py.
Notation as docs/method.md: H_v virtual heads, H_kv KV heads, H_p = H_v / H_kv physical heads, d head width,
r physical width, R Postmix rank, t the tensor-parallel size.

Attention, rank k of t (virtual heads are group-major, j = g*H_p + i):

* virtual heads [k*H_v/t, (k+1)*H_v/t) — a contiguous block, so each rank's heads read whole KV groups;
* t <= H_kv (KV split): rank k owns KV groups [k*H_kv/t, (k+1)*H_kv/t), i.e. all H_p physical heads of those
  groups: k_proj / v_proj / Premix are sharded by group;
* t >  H_kv (KV replicated, as Megatron does when query groups < world size): c = t/H_kv ranks share group
  g = k // c; rank k uses KV head g and physical heads [(k % c)*H_p/c, (k % c + 1)*H_p/c). k_proj / v_proj and
  Premix stay whole on every rank (each rank reads its slice) with their gradients summed;
* q_proj is replicated: every rank needs the physical heads of its groups (all H_p when t <= H_kv). Its
  gradient is summed across ranks (each rank's is the part its own groups contribute); q_norm / k_norm alike;
* Postmix U, V and the gate are sharded by virtual head (rows of U, V; columns of gate_proj), o_proj by its
  input rows (row-parallel, as Qwen3's); one all-reduce of Z = sum_k U_k^T Y_k (R x d per token) mixes heads
  across ranks, and o_proj's all-reduce (h per token) closes the layer.

MLP as Qwen3's: gate_proj / up_proj column-parallel, down_proj row-parallel. Embedding, norms and lm_head stay
replicated (PaddleFormers' vocab-parallel head needs c_softmax_with_cross_entropy, which has no CPU kernel).

Without Premix (vha_premix=false) the physical heads are the virtual heads: q_proj is column-parallel by head as
stock Qwen3's (rank k holds its H_v/t heads, whatever t vs H_kv), and the rest is as above.

The layer's two hooks carry the rest: `premix_weight()` reads the rank's group of a whole Premix (KV replicated) and
`postmix_reduce` is the all-reduce of Z.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

from ..spec.sharding import LayerPlan, TPPlanError, check_head_split, check_mlp_split, check_size, gqa_layout
from ..spec.params import ModelSpec
from .spec import QWEN3_VHA, kv_projections

__all__ = ["AttentionLayout", "attention_layout", "check", "layer_plan", "VHAPlan", "TPPlanError"]


@dataclass(frozen=True)
class AttentionLayout:
    """What rank `rank` of `t` computes in one attention layer."""

    t: int
    rank: int
    heads: Tuple[int, int]  # virtual heads [a, b)
    groups: Tuple[int, int]  # KV groups (= KV heads) [a, b) this rank reads
    physical: Tuple[int, int]  # physical query heads [a, b) this rank uses
    kv_sharded: bool  # t <= H_kv: KV heads split; else replicated (whole tensors, rank-local slice)
    premix: bool = True  # False: the physical heads are the virtual heads (q_proj split by head)

    @property
    def num_heads(self) -> int:
        return self.heads[1] - self.heads[0]

    @property
    def num_kv_heads(self) -> int:
        return self.groups[1] - self.groups[0]

    @property
    def num_physical(self) -> int:
        return self.physical[1] - self.physical[0]


def _heads(cfg, layer_idx):
    """(H_v, H_kv) of a layer: a sliding-window layer may have its own (config.layer_dims); plain configs: one pair."""
    if layer_idx is None or not hasattr(cfg, "layer_dims"):
        return cfg.num_attention_heads, cfg.num_key_value_heads
    dims = cfg.layer_dims(layer_idx)
    return dims.num_heads, dims.num_kv_heads


def check(cfg, t: int) -> None:
    """TPPlanError (one line) if the Qwen3-VHA config cannot be sharded over t ranks."""
    check_size(t)
    if t > 1 and getattr(cfg, "vha_postmix_form", "auto") == "dense":
        raise TPPlanError("vha_postmix_form='dense' needs every head's output on each rank (an all-gather of H_v*d per "
                          "token); under tensor parallelism Postmix runs low-rank (one all-reduce of R*d): use 'auto' "
                          "or 'lowrank'")
    layers = range(cfg.num_hidden_layers) if hasattr(cfg, "layer_dims") else [None]
    for (h_v, h_kv), i in sorted({_heads(cfg, i): i for i in layers}.items()):
        window = " on the sliding-window layers" if i is not None and (h_v, h_kv) != _heads(cfg, None) else ""
        check_head_split(h_v, h_kv, t, f"num_attention_heads (virtual heads H_v={h_v}){window}",
                         f"num_key_value_heads H_kv={h_kv}{window}", "H_kv")
    check_mlp_split(cfg, t)


def attention_layout(cfg, t: int, rank: int, layer_idx: int = None) -> AttentionLayout:
    check(cfg, t)
    h_v, h_kv = _heads(cfg, layer_idx)
    h_p = h_v // h_kv
    lay = gqa_layout(h_v, h_kv, t, rank)  # virtual heads over KV groups, as any GQA layer
    premix = getattr(cfg, "vha_premix", True)
    if not premix:  # the rank's own virtual heads are its physical heads
        physical = lay.heads
    elif lay.kv_sharded:  # whole groups: all H_p physical heads
        physical = (0, h_p)
    else:  # c = t/H_kv ranks share a group; each uses its H_p/c physical heads
        c = t // h_kv
        n, s = h_p // c, rank % c
        physical = (s * n, (s + 1) * n)
    return AttentionLayout(t, rank, lay.heads, lay.kv, physical, lay.kv_sharded, premix)


def layer_plan(cfg, t: int, rank: int, layer_idx: int, spec: ModelSpec = QWEN3_VHA) -> LayerPlan:
    """Rank `rank`'s part of VHA decoder layer `layer_idx` (window layers may have their own sizes), every tensor's
    shard as `spec` (the family's: VHA over its base) declares it."""
    lay = attention_layout(cfg, t, rank, layer_idx)
    dims = cfg.layer_dims(layer_idx)
    d, r = dims.head_dim, dims.q_head_dim
    attrs = dict(num_heads=lay.num_heads, num_key_value_heads=lay.num_kv_heads,
                 num_key_value_groups=lay.num_heads // lay.num_kv_heads, num_physical_heads=lay.num_physical,
                 premix_groups=None)
    columns = {}
    if not lay.kv_sharded:
        # K/V and Premix stay whole; this rank computes its KV head and its physical heads only.
        (g0, g1), (p0, p1) = lay.groups, lay.physical
        kv = kv_projections(cfg)
        columns = {f"self_attn.{n}": (g0 * d, g1 * d) for n in kv}
        if lay.premix:
            columns["self_attn.q_proj"] = (p0 * r, p1 * r)
            attrs["premix_groups"] = lay.groups
    return LayerPlan(params=spec.layer_shards(cfg, layer_idx, lay), column_slices=columns,
                     attributes={"self_attn": attrs}, collectives={"self_attn.postmix_reduce": "all_reduce_partial"})


class VHAPlan:
    """This module's plan over a VHA family's spec (VHA over another base: paddle_vha/llama/, paddle_vha/qwen2/), as
    the registry's `tp_plan` asks for it: check(cfg, t), layer_plan(cfg, t, rank, i)."""

    check = staticmethod(check)

    def __init__(self, spec: ModelSpec):
        self.spec = spec

    def layer_plan(self, cfg, t: int, rank: int, layer_idx: int) -> LayerPlan:
        return layer_plan(cfg, t, rank, layer_idx, self.spec)
