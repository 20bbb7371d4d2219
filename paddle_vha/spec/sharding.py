"""Tensor-parallel plans as data: what one rank holds and computes in one decoder layer, and where it communicates.

Each family writes its plan in its own folder (paddle_vha/{vha,mea}/tp_plan.py, the stock GQA layer in
paddle_vha/qwen3/tp_plan.py) as pure arithmetic on the config, no Paddle: `layer_plan(cfg, t, rank, i)` returns a
LayerPlan, `check(cfg, t)` refuses a config it cannot shard with one line. Which tensor splits along which axis is
declared with the tensors themselves (each family's spec.py, paddle_vha/spec/params.py). paddle_vha/parallel/apply.py applies any
LayerPlan the same way. Notation: t ranks, rank k; Paddle Linear weights are [in, out] in memory (column-parallel =
axis 1, row-parallel = axis 0).

Every parameter is either split disjointly over the t ranks along one axis, or whole on every rank (with its
gradient summed when each rank uses only part of it): that is all the sharded save / merge needs.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Optional, Tuple

__all__ = ["TPPlanError", "TensorShard", "HeadLayout", "LayerPlan", "REPLICATED_SUMMED", "check_size",
           "check_head_split", "gqa_layout", "check_mlp_split", "ROW_PARALLEL"]


class TPPlanError(ValueError):
    """A config / tensor-parallel size combination the plan cannot shard; one line naming the reason."""


@dataclass(frozen=True)
class TensorShard:
    """How one in-memory (Paddle layout) parameter is distributed.

    axis None: whole on every rank; grad_sum then says whether each rank's gradient is partial (summed by a hook).
    axis a: rank k holds [k*n/t, (k+1)*n/t) along a (disjoint, marked is_distributed).
    """

    axis: Optional[int]
    grad_sum: bool = False


REPLICATED_SUMMED = TensorShard(None, grad_sum=True)

# The Linears that close a layer's TP region: they hold this rank's input rows, their partial products are summed
# by one all-reduce (then the bias is added once). Stock Qwen3's, VHA's and MEA's alike.
ROW_PARALLEL = ("self_attn.o_proj", "mlp.down_proj")


@dataclass(frozen=True)
class LayerPlan:
    """One rank's part of one decoder layer. Names are relative to the decoder layer ("self_attn.q_proj.weight")."""

    params: Dict[str, TensorShard]  # parameters not listed are whole on every rank, with full gradients
    row_parallel: Tuple[str, ...] = ROW_PARALLEL
    column_slices: Dict[str, Tuple[int, int]] = field(default_factory=dict)  # whole Linears computing columns [a, b)
    attributes: Dict[str, Dict[str, Any]] = field(default_factory=dict)  # sublayer -> attribute values set on it
    # sublayer attribute -> collective set there (the layer's hook, e.g. VHA's Postmix exchange): "all_reduce_partial"
    collectives: Dict[str, str] = field(default_factory=dict)
    # sublayers whose input enters the TP region (identity forward, gradient all-reduced backward: Megatron's "f")
    enter_region: Tuple[str, ...] = ("self_attn", "mlp")


@dataclass(frozen=True)
class HeadLayout:
    """What rank `rank` of `t` computes in one GQA-shaped attention layer (MEA: the KV heads are the virtual ones)."""

    t: int
    rank: int
    heads: Tuple[int, int]  # query heads [a, b)
    kv: Tuple[int, int]  # KV heads [a, b) this rank reads
    kv_sharded: bool  # t <= n_kv: KV heads split; else replicated (whole tensors, rank-local slice)

    @property
    def num_heads(self) -> int:
        return self.heads[1] - self.heads[0]

    @property
    def num_kv_heads(self) -> int:
        return self.kv[1] - self.kv[0]


def check_size(t) -> None:
    if not (isinstance(t, int) and not isinstance(t, bool) and t >= 1):
        raise TPPlanError(f"tensor-parallel size must be an int >= 1, got {t!r}")


def check_head_split(h: int, n_kv: int, t: int, h_desc: str, kv_desc: str, kv_short: str) -> None:
    """TPPlanError unless h query heads over n_kv KV heads split over t ranks: t divides h, and t divides n_kv
    (KV heads split) or is a multiple of it (each KV head replicated on t / n_kv ranks). The descriptions name the
    fields in the message (h_desc e.g. 'num_attention_heads=12', kv_desc 'mea_kv_heads=4', kv_short 'mea_kv_heads')."""
    if h % t:
        raise TPPlanError(f"{h_desc} must be divisible by the tensor-parallel size t={t}")
    if t <= n_kv and n_kv % t:
        raise TPPlanError(f"{kv_desc} must be divisible by t={t} (KV heads are split when t <= {kv_short})")
    if t > n_kv and t % n_kv:
        raise TPPlanError(f"t={t} > {kv_short}={n_kv}: t must be a multiple of {kv_short} (each KV head is replicated "
                          f"on t/{kv_short} ranks)")


def gqa_layout(h: int, n_kv: int, t: int, rank: int) -> HeadLayout:
    """Query heads [rank*h/t, ...) and the KV heads they read (query head i reads KV head i // (h/n_kv)).

    For a split that check_head_split accepts."""
    assert h % t == 0 and (n_kv % t == 0 if t <= n_kv else t % n_kv == 0), (h, n_kv, t)
    per = h // t
    heads = (rank * per, (rank + 1) * per)
    if t <= n_kv:
        g = n_kv // t
        return HeadLayout(t, rank, heads, (rank * g, (rank + 1) * g), kv_sharded=True)
    g = rank // (t // n_kv)
    return HeadLayout(t, rank, heads, (g, g + 1), kv_sharded=False)


def check_mlp_split(cfg, t: int) -> None:
    """TPPlanError unless the Qwen3 MLP splits over t ranks (gate / up column-parallel, down row-parallel; the shards
    themselves are declared with the tensors, paddle_vha/qwen3/spec.py)."""
    inter = cfg.intermediate_size
    if inter % t:
        raise TPPlanError(f"intermediate_size={inter} must be divisible by t={t} (column/row-parallel MLP)")
    if getattr(cfg, "fuse_attention_ffn", False):
        raise TPPlanError("fuse_attention_ffn=True is not supported by the tensor-parallel plan (fused up|gate "
                          "columns would need interleaved sharding); set fuse_attention_ffn=False")
