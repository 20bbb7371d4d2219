"""Tensor-parallel plan for Qwen3-VHA: which slice of which tensor each rank holds, and why.

Pure arithmetic on the config (no Paddle), so tools and tests can print or check a plan without processes.
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

Every tensor is either sharded disjointly over all t ranks along one axis, or whole on every rank; that is all
`merge` needs to rebuild the single-device checkpoint.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Tuple

__all__ = ["TPPlanError", "TensorShard", "AttentionLayout", "HeadLayout", "attention_layout", "gqa_layout",
           "tensor_shards", "check_plan", "check_head_split", "mlp_shards"]


class TPPlanError(ValueError):
    """A config / tensor-parallel size combination the plan cannot shard; one line naming the reason."""


@dataclass(frozen=True)
class AttentionLayout:
    """What rank `rank` of `t` computes in one attention layer."""

    t: int
    rank: int
    heads: Tuple[int, int]  # virtual heads [a, b)
    groups: Tuple[int, int]  # KV groups (= KV heads) [a, b) this rank reads
    physical: Tuple[int, int]  # physical query heads [a, b) this rank uses
    kv_sharded: bool  # t <= H_kv: KV heads split; else replicated (whole tensors, rank-local slice)

    @property
    def num_heads(self) -> int:
        return self.heads[1] - self.heads[0]

    @property
    def num_kv_heads(self) -> int:
        return self.groups[1] - self.groups[0]

    @property
    def num_physical(self) -> int:
        return self.physical[1] - self.physical[0]


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


@dataclass(frozen=True)
class TensorShard:
    """How one in-memory (Paddle layout) tensor is distributed.

    axis None: whole on every rank; grad_sum then says whether each rank's gradient is partial (summed by a hook).
    axis a: rank k holds [k*n/t, (k+1)*n/t) along a (disjoint, marked is_distributed).
    """

    axis: Optional[int]
    grad_sum: bool = False


def _cfg(cfg, key):
    return cfg[key] if isinstance(cfg, dict) else getattr(cfg, key)


def check_plan(cfg, t: int) -> None:
    """TPPlanError (one line) if config `cfg` cannot be sharded over t ranks (Qwen3-MEA configs: mea_plan.py)."""
    if (cfg.get("mea_kv_heads") if isinstance(cfg, dict) else getattr(cfg, "mea_kv_heads", None)) is not None:
        from .mea_plan import check_mea_plan

        return check_mea_plan(cfg, t)
    check_size(t)
    h_v, h_kv = _cfg(cfg, "num_attention_heads"), _cfg(cfg, "num_key_value_heads")
    check_head_split(h_v, h_kv, t, f"num_attention_heads (virtual heads H_v={h_v})", f"num_key_value_heads H_kv={h_kv}",
                     "H_kv")
    mlp_shards(cfg, t)


def check_size(t) -> None:
    if not (isinstance(t, int) and t >= 1):
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


def mlp_shards(cfg, t: int) -> Dict[str, TensorShard]:
    """The Qwen3 MLP's shards (names relative to a decoder layer), or TPPlanError if it cannot be split over t."""
    inter = _cfg(cfg, "intermediate_size")
    if inter % t:
        raise TPPlanError(f"intermediate_size={inter} must be divisible by t={t} (column/row-parallel MLP)")
    if _cfg(cfg, "fuse_attention_ffn") if not isinstance(cfg, dict) else cfg.get("fuse_attention_ffn"):
        raise TPPlanError("fuse_attention_ffn=True is not supported by the tensor-parallel plan (fused up|gate "
                          "columns would need interleaved sharding); set fuse_attention_ffn=False")
    return {
        "mlp.gate_proj.weight": TensorShard(1),
        "mlp.gate_proj.bias": TensorShard(0),
        "mlp.up_proj.weight": TensorShard(1),
        "mlp.up_proj.bias": TensorShard(0),
        "mlp.down_proj.weight": TensorShard(0),
        "mlp.down_proj.bias": TensorShard(None),
    }


def attention_layout(cfg, t: int, rank: int) -> AttentionLayout:
    check_plan(cfg, t)
    h_v, h_kv = _cfg(cfg, "num_attention_heads"), _cfg(cfg, "num_key_value_heads")
    h_p = h_v // h_kv
    lay = gqa_layout(h_v, h_kv, t, rank)  # virtual heads over KV groups, as any GQA layer
    if lay.kv_sharded:  # whole groups: all H_p physical heads
        physical = (0, h_p)
    else:  # c = t/H_kv ranks share a group; each uses its H_p/c physical heads
        c = t // h_kv
        n, s = h_p // c, rank % c
        physical = (s * n, (s + 1) * n)
    return AttentionLayout(t, rank, lay.heads, lay.kv, physical, lay.kv_sharded)


def tensor_shards(cfg, t: int) -> Dict[str, TensorShard]:
    """In-memory parameter name suffix (relative to a decoder layer, e.g. 'self_attn.q_proj.weight') -> shard.

    Names not listed (embedding, norms, lm_head, ...) are whole on every rank with full gradients.
    Paddle Linear weights are [in, out] in memory: column-parallel = axis 1, row-parallel = axis 0.
    """
    check_plan(cfg, t)
    kv_split = t <= _cfg(cfg, "num_key_value_heads")
    rep_sum = TensorShard(None, grad_sum=True)
    a = "self_attn."
    shards = {
        a + "q_proj.weight": rep_sum,
        a + "q_proj.bias": rep_sum,
        a + "q_norm.weight": rep_sum,
        a + "k_norm.weight": rep_sum,
        a + "vha_premix_weight": TensorShard(0) if kv_split else rep_sum,
        a + "k_proj.weight": TensorShard(1) if kv_split else rep_sum,
        a + "k_proj.bias": TensorShard(0) if kv_split else rep_sum,
        a + "v_proj.weight": TensorShard(1) if kv_split else rep_sum,
        a + "v_proj.bias": TensorShard(0) if kv_split else rep_sum,
        a + "vha_postmix_U": TensorShard(0),
        a + "vha_postmix_V": TensorShard(0),
        a + "gate_proj.weight": TensorShard(1),
        a + "o_proj.weight": TensorShard(0),
        a + "o_proj.bias": TensorShard(None),  # added after the all-reduce: full gradient on every rank
    }
    shards.update(mlp_shards(cfg, t))
    return shards
