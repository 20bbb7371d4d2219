"""Qwen3-VHA's tensors, declared once: stock Qwen3's layer (paddle_vha/qwen3/spec.py) with a narrower q_proj, Premix,
Postmix, and optionally one shared K = V projection and a sigmoid gate (docs/checkpoint.md, docs/method.md).

Sizes per layer (a sliding-window layer may have its own: Qwen3VHAConfig.layer_dims): H_v virtual heads, H_kv KV heads,
H_p = H_v / H_kv physical heads of width r, head width d, Postmix rank R.

Tensor parallelism, rank k of t (why: paddle_vha/vha/tp_plan.py): q_proj whole on every rank (each needs the physical
heads of its groups) with its gradient summed; K/V (or the shared projection) and Premix split by KV group when
t <= H_kv, else whole with summed gradients; Postmix U, V and the gate split by virtual head; o_proj row-parallel.
Fold absorbs Premix into q_proj and Postmix into o_proj.

Window layers with window_attention_sinks hold `self_attn.sinks` [H_v], a sink logit per virtual head (split with the
virtual heads; fold copies it: paddle_vha/sinks/spec.py).

Without Premix (vha_premix=false): q_proj emits the H_v heads of width d as stock Qwen3's does, column-parallel by
head; there is no vha_premix_weight, and fold changes o_proj only.
"""
from __future__ import annotations

import math
from types import SimpleNamespace

from ..qwen3.spec import O_PROJ, QWEN3, QWEN3_LAYER
from ..sinks.spec import sinks_param
from ..spec.params import COLUMN, SUMMED, LayerSpec, ModelSpec, Param, TensorShard, linear, split_kv
from .fold_rules import POSTMIX, PREMIX

__all__ = ["VHA_LAYER", "QWEN3_VHA", "vha_sizes_over", "vha_layer", "vha_model_spec", "tensor_shapes", "kv_projections", "projections_for",
           "absorbed_by", "PREMIX_TENSORS", "POSTMIX_TENSORS", "init_premix"]


def vha_sizes_over(base_sizes):
    """The sizes function of a VHA layer over a base layer's (its widths and bias flags): the layer's VHA dims
    (Qwen3VHAConfig.layer_dims) in place of the base's head counts and width."""
    def vha_sizes(cfg, layer_idx: int) -> SimpleNamespace:
        dims = cfg.layer_dims(layer_idx)
        s = base_sizes(cfg, layer_idx)  # h, MLP width, bias flags as the base reads them
        s.heads, s.kv_heads, s.head_dim, s.physical = dims.num_heads, dims.num_kv_heads, dims.head_dim, \
            dims.num_physical_heads
        s.q_head_dim, s.postmix_rank, s.premix = dims.q_head_dim, dims.postmix_rank, dims.premix
        s.shared_kv, s.gated = bool(cfg.vha_shared_kv), bool(cfg.vha_gated_attention)
        s.sinks = bool(getattr(cfg, "has_sinks", lambda i: False)(layer_idx))
        return s
    return vha_sizes


def init_premix(num_groups: int, r: int, d: int, alpha: float):
    """Premix initial value [H_kv, r, d].

    r == d: I + alpha/sqrt(d) * N(0, 1) per group (close to identity).
    r <  d: rows of a random orthogonal d x d matrix, scaled by sqrt(d / r) so that
            E|q W|^2 = (d / r) |q|^2 matches the width growth r -> d.
    """
    import paddle

    mats = []
    for _ in range(num_groups):
        if r == d:
            mats.append(paddle.eye(d, dtype="float32") + (alpha / math.sqrt(d)) * paddle.randn([d, d], dtype="float32"))
        else:
            q, _ = paddle.linalg.qr(paddle.randn([d, r], dtype="float32"))  # (d, r), orthonormal columns
            mats.append(q.transpose([1, 0]) * math.sqrt(d / r))  # (r, d), orthogonal rows
    return paddle.stack(mats).astype(paddle.get_default_dtype())  # (H_kv, r, d)


def _premix_init(s, cfg):
    from paddle import nn

    return nn.initializer.Assign(init_premix(s.kv_heads, s.q_head_dim, s.head_dim, cfg.vha_premix_init_alpha))


def _normal_or_zero(field: str):
    """N(0, std) with std = config.<field>, or 0 for std 0 (Postmix V = 0: M is the identity at step 0)."""
    def init(s, cfg):
        from paddle import nn
        std = getattr(cfg, field)
        return nn.initializer.Normal(0.0, std) if std > 0 else nn.initializer.Constant(0.0)
    return init


_kv = lambda s: s.kv_heads * s.head_dim  # noqa: E731
_separate_kv = lambda s: not s.shared_kv  # noqa: E731
# q_proj: whole on every rank with Premix (each rank needs its groups' physical heads), split by head without it
_q_shard = lambda lay: SUMMED if getattr(lay, "premix", True) else COLUMN  # noqa: E731

def vha_layer(base: LayerSpec) -> LayerSpec:
    """A VHA layer over a base's decoder layer (Qwen3's, Llama's, Qwen2's): the base's tensors with a narrower q_proj,
    Premix and Postmix, optionally one shared K = V projection and the gate; the base's q/k norms and biases as it
    declares them."""
    return base.replace(
        f"{base.name}_vha",
        sizes=vha_sizes_over(base.sizes),
        add=(
            # q_proj emits H_p physical heads of width r (H_v heads of width d without Premix)
            *linear("self_attn.q_proj", lambda s: s.physical * s.q_head_dim, lambda s: s.h, _q_shard),
            *linear("self_attn.k_proj", _kv, lambda s: s.h, split_kv(COLUMN), when=_separate_kv),
            *linear("self_attn.v_proj", _kv, lambda s: s.h, split_kv(COLUMN), when=_separate_kv),
            *O_PROJ,
            # one projection that is both keys and values (vha_shared_kv), split as the keys are
            *linear("self_attn.shared_kv_proj", _kv, lambda s: s.h, split_kv(COLUMN), when=lambda s: s.shared_kv),
            Param("self_attn.vha_premix_weight", lambda s: (s.kv_heads, s.q_head_dim, s.head_dim),
                  split_kv(TensorShard(0)), fold=PREMIX, init=_premix_init, when=lambda s: s.premix),
            Param("self_attn.vha_postmix_U", lambda s: (s.heads, s.postmix_rank), TensorShard(0), fold=POSTMIX,
                  init=_normal_or_zero("vha_postmix_u_init_std")),
            Param("self_attn.vha_postmix_V", lambda s: (s.heads, s.postmix_rank), TensorShard(0), fold=POSTMIX,
                  init=_normal_or_zero("vha_postmix_v_init_std")),
            *linear("self_attn.gate_proj", lambda s: s.heads * s.head_dim, lambda s: s.h, COLUMN, bias=None,
                    when=lambda s: s.gated),
            # a sink logit per virtual head of a window layer (window_attention_sinks), split with the heads; fold
            # keeps it
            sinks_param(),
        ),
    )


def vha_model_spec(base: ModelSpec, layer: LayerSpec) -> ModelSpec:
    """A VHA family's tensors over a base's: the base's top tensors, every decoder layer `layer` (vha_layer of the
    base's)."""
    return ModelSpec(top=base.top, top_sizes=base.top_sizes, layer=lambda cfg, i: layer)


VHA_LAYER = vha_layer(QWEN3_LAYER)

QWEN3_VHA = vha_model_spec(QWEN3, VHA_LAYER)
tensor_shapes = QWEN3_VHA.tensor_shapes  # the on-disk contract: name -> HF-layout shape


def kv_projections(cfg) -> tuple:
    """The Linears (relative to self_attn) that emit the cached heads of config `cfg`'s layers."""
    return projections_for(bool(cfg.vha_shared_kv))


def projections_for(shared_kv: bool) -> tuple:
    """The Linears (relative to self_attn) that emit the cached heads: k_proj and v_proj, or the shared projection
    (what the cost model names a layer's K/V parts by: paddle_vha/vha/cost.py)."""
    return ("shared_kv_proj",) if shared_kv else ("k_proj", "v_proj")


def absorbed_by(rule) -> tuple:
    """The tensors (relative to self_attn) the layer declares as absorbed by fold rule `rule`, in spec order (what
    convert_to_vha writes for them: paddle_vha/transform/convert_to_vha.py)."""
    return tuple(p.name[len("self_attn."):] for p in VHA_LAYER.params if p.fold is rule)


PREMIX_TENSORS = absorbed_by(PREMIX)  # the Premix weight [H_kv, r, d]
POSTMIX_TENSORS = absorbed_by(POSTMIX)  # Postmix U, V [H_v, R], in that order
