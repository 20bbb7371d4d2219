"""The cost model's data: `Arch` (one decoder-only model with one attention kind) and `AttentionCost`, the formulas of
one kind of attention layer.

Every attention kind's formulas live with their family (paddle_vha/qwen3/cost.py: stock MHA / GQA and folded VHA,
paddle_vha/vha/cost.py, paddle_vha/mea/cost.py) or, for comparison-only kinds, with the calculators
(paddle_vha/accounting.py: MLA); paddle_vha/accounting.py is generic code over them. Pure Python.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

__all__ = ["Arch", "ArchError", "AttentionCost", "WINDOW_SIZE_FIELDS"]

WINDOW_SIZE_FIELDS = ("num_heads", "num_kv_heads", "head_dim", "vha_q_head_dim", "vha_postmix_rank")


class ArchError(ValueError):
    """A description or config.json the calculators cannot account for; the message is one line."""


@dataclass(frozen=True)
class Arch:
    """One decoder-only model with one attention variant.

    `num_heads` is the number of query heads attention sees (virtual heads H_v for VHA); `num_kv_heads` is the
    number of KV heads the cache stores (MEA: the physical n_p; MLA: unused, it caches a latent). Its formulas are
    those of `kind` (AttentionCost.of).
    """

    label: str
    kind: str
    hidden_size: int
    num_layers: int
    head_dim: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool = True
    attention_bias: bool = False  # q / k / v biases (and o_proj's unless o_bias says otherwise)
    o_bias: Optional[bool] = None  # o_proj's bias; None: as attention_bias (Qwen2: q/k/v biased, o_proj not)
    qk_norm: bool = True  # per-head q/k RMSNorm weights (Qwen3; not Llama or Qwen2)
    # VHA (kind "vha"): H_p = num_heads / num_kv_heads physical query heads of width r, Postmix rank R.
    vha_q_head_dim: Optional[int] = None
    vha_postmix_rank: int = 0
    vha_gated: bool = False
    # The Linears that emit the cached heads, as the family's spec names them (the K/V parts of the weights): keys and
    # values, or one projection that is both (VHA's vha_shared_kv and the stock-shaped model it folds into: the cache
    # then holds one tensor per layer).
    kv_projections: Tuple[str, ...] = ("k_proj", "v_proj")
    # MLA (kind "mla"), DeepSeek-V2 parameterisation: latent c_kv plus a decoupled RoPE key.
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0
    q_lora_rank: int = 0
    # MEA (kind "mea"): n_v virtual KV heads composed from the n_p = num_kv_heads cached ones, in
    # `mea_num_layers` layers (None: all); the other layers are stock with `mea_stock_kv_heads` (default n_v).
    mea_kv_heads: int = 0
    mea_num_layers: Optional[int] = None
    mea_group_norm: bool = True
    mea_stock_kv_heads: Optional[int] = None
    # Mixture of experts: the MLP FLOPs are those of the routed experts a token uses (+ the router).
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    num_moe_layers: Optional[int] = None  # None: all layers are MoE when num_experts > 0
    # Sliding-window layers (Qwen3's layer_types + sliding_window): `num_window_layers` of the layers attend to the
    # last `sliding_window` positions and cache at most sliding_window - 1 of them; `window_sizes` holds the
    # (field, value) pairs in which those layers differ (num_heads, num_kv_heads, head_dim, vha_q_head_dim,
    # vha_postmix_rank: VHA's vha_window_* options).
    sliding_window: Optional[int] = None
    num_window_layers: int = 0
    window_sizes: tuple = ()
    notes: tuple = ()

    def __post_init__(self):
        cost = AttentionCost.of(self)  # ArchError for an unknown kind
        if not (isinstance(self.kv_projections, tuple) and len(self.kv_projections) in (1, 2)):
            raise ArchError(f"{self.label}: kv_projections must name one (K = V) or two (K, V) projections, got "
                            f"{self.kv_projections!r}")
        for name in ("hidden_size", "num_layers", "head_dim", "num_heads", "vocab_size"):
            v = getattr(self, name)
            if not (isinstance(v, int) and not isinstance(v, bool) and v >= 1):
                raise ArchError(f"{self.label}: {name} must be a positive int, got {v!r}")
        cost.validate(self)
        if self.num_experts and (self.num_experts_per_tok < 1 or self.moe_intermediate_size < 1):
            raise ArchError(f"{self.label}: MoE needs num_experts_per_tok >= 1 and moe_intermediate_size >= 1")
        if not 0 <= self.num_window_layers <= self.num_layers:
            raise ArchError(f"{self.label}: num_window_layers={self.num_window_layers} not in [0, {self.num_layers}]")
        if self.num_window_layers and not (isinstance(self.sliding_window, int) and self.sliding_window >= 1):
            raise ArchError(f"{self.label}: sliding-window layers need sliding_window >= 1, got {self.sliding_window!r}")
        if self.num_window_layers and not cost.windows:
            raise ArchError(f"{self.label}: sliding-window layers are modelled for MHA / GQA / VHA only")
        unknown = [k for k, _ in self.window_sizes if k not in WINDOW_SIZE_FIELDS]
        if unknown:
            raise ArchError(f"{self.label}: window_sizes may set {', '.join(WINDOW_SIZE_FIELDS)}, not {unknown[0]}")
        if self.num_window_layers:
            self.window_layer()  # its own sizes are checked like a model's

    @property
    def cost(self) -> "AttentionCost":
        return AttentionCost.of(self)

    def window_layer(self) -> "Arch":
        """One sliding-window layer as a model of its own sizes (its attention is what the per-layer figures of a
        window layer are computed from)."""
        return self.replace(num_window_layers=0, window_sizes=(), **dict(self.window_sizes))

    @property
    def full_layers(self) -> int:
        """Layers that attend to (and cache) the whole context."""
        return self.num_layers - self.num_window_layers

    @property
    def shared_kv(self) -> bool:
        """Whether one projection is both keys and values (the cache holds one tensor per layer)."""
        return len(self.kv_projections) == 1

    @property
    def q_head_dim(self) -> int:
        """r: width of a physical query head (VHA); d otherwise."""
        return self.vha_q_head_dim or self.head_dim

    @property
    def physical_heads(self) -> int:
        """Query heads q_proj emits: H_p = H_v / H_kv for VHA, num_heads otherwise."""
        return self.cost.physical_heads(self)

    @property
    def group_size(self) -> int:
        """Query heads per cached KV head (what a decode kernel batches)."""
        return self.cost.group_size(self)

    def replace(self, **changes) -> "Arch":
        return dataclasses.replace(self, **changes)


class AttentionCost:
    """The formulas of one attention kind; the base class is a stock MHA / GQA layer (`kind` says which).

    A kind overrides what differs: its checks, its query heads, its matmul weights by part, the FLOPs of parts that
    are not plain Linears, its biases and norms, the cache one token adds, how the layers of a model group, and its
    served form. Instances register themselves by kind (`AttentionCost.of(arch)` finds one)."""

    kind = "gqa"
    windows = True  # sliding-window layers are modelled for it
    _registry: Dict[str, "AttentionCost"] = {}

    def __init__(self, kind: Optional[str] = None):
        if kind is not None:
            self.kind = kind
        AttentionCost._registry[self.kind] = self

    @classmethod
    def of(cls, a: Arch) -> "AttentionCost":
        return cls.for_kind(a.kind)

    @classmethod
    def for_kind(cls, kind: str) -> "AttentionCost":
        if kind not in cls._registry:
            raise ArchError(f"unknown attention kind {kind!r} (expected one of {', '.join(cls._registry)})")
        return cls._registry[kind]

    @classmethod
    def kinds(cls) -> Tuple[str, ...]:
        return tuple(cls._registry)

    # checks and head counts
    def validate(self, a: Arch) -> None:
        if not (isinstance(a.num_kv_heads, int) and a.num_kv_heads >= 1):
            raise ArchError(f"{a.label}: num_kv_heads must be a positive int, got {a.num_kv_heads!r}")
        if a.num_heads % a.num_kv_heads:
            raise ArchError(f"{a.label}: num_heads={a.num_heads} is not a multiple of num_kv_heads={a.num_kv_heads}")

    def physical_heads(self, a: Arch) -> int:
        return a.num_heads

    def group_size(self, a: Arch) -> int:
        return a.num_heads // a.num_kv_heads

    # the layers of a model: (the layer as an Arch of its own sizes, how many, its window or None)
    def layers(self, a: Arch) -> List[Tuple[Arch, int, Optional[int]]]:
        groups = [(a, a.full_layers, None)]
        if a.num_window_layers:
            groups.append((a.window_layer(), a.num_window_layers, a.sliding_window))
        return groups

    # one layer
    def kv_bytes(self, a: Arch, bytes_per_elem: float) -> float:
        """Cache bytes one token adds to one layer: K and V (or the one shared K = V) of every KV head."""
        return len(a.kv_projections) * a.num_kv_heads * a.head_dim * bytes_per_elem

    def weights(self, a: Arch) -> Dict[str, int]:
        """Matmul weights of one attention layer by part (biases and norms excluded)."""
        h, d, kv = a.hidden_size, a.head_dim, a.num_kv_heads
        parts = {"q_proj": h * self.physical_heads(a) * a.q_head_dim}
        parts.update({name: h * kv * d for name in a.kv_projections})  # K and V, or the one K = V projection
        parts["o_proj"] = a.num_heads * d * h
        return parts

    def biases_and_norms(self, a: Arch, parts: Dict[str, int]) -> Dict[str, int]:
        """`parts` with the biases (attention_bias, o_bias) added to their Linears and the norm weights (qk_norm) as
        parts."""
        h, d = a.hidden_size, a.head_dim
        if a.attention_bias:
            parts["q_proj"] += self.physical_heads(a) * a.q_head_dim
            for name in a.kv_projections:
                parts[name] += a.num_kv_heads * d
        if a.attention_bias if a.o_bias is None else a.o_bias:
            parts["o_proj"] += h
        if a.qk_norm:
            parts["qk_norm"] = 2 * d
        return parts

    def part_flops(self, a: Arch, name: str, n: int) -> float:
        """Forward FLOPs per token of weight part `name` (n weights): a Linear's 2 per weight."""
        return 2 * n

    def score_widths(self, a: Arch) -> Tuple[int, int]:
        """(query-key width, value width) of one head in the attention scores and the weighted sum."""
        return a.head_dim, a.head_dim

    def named_fields(self, shape: dict) -> dict:
        """Fields this kind takes from a named shape (paddle_vha/accounting.py NAMED_SHAPES) beyond the common ones."""
        return {}

    def cache_description(self, a: Arch) -> str:
        """What one layer caches, in words (tools/kv_calc.py)."""
        return f"{a.num_kv_heads} shared K=V heads" if a.shared_kv else f"{a.num_kv_heads} KV heads"

    def with_shared_kv(self, a: Arch) -> Arch:
        """`a` with one projection that is both keys and values, named as the kind's spec names it (ArchError where
        the kind has no such form)."""
        raise ArchError(f"{a.label}: attention kind {a.kind!r} has no shared-KV form here")

    def served_as(self, a: Arch, label: Optional[str] = None) -> Optional[Arch]:
        """The architecture a checkpoint of this kind is served as, when that is another one (VHA: folded); None when
        it is served as it is."""
        return None
