"""Qwen3-MEA's tensors, declared once (docs/mea.md): per layer either an MEA layer or a stock Qwen3 layer.

An MEA layer has n_p-head k_proj / v_proj (the cached physical heads), the HLC coefficients mea_k_lc / mea_v_lc
[n_p, n_v] and, with mea_group_norm, the head norm's weight mea_norm.weight [H*d]. A layer outside mea_layers is stock
Qwen3 attention with mea_stock_kv_heads KV heads.

Tensor parallelism (why: paddle_vha/mea/tp_plan.py): query heads column-parallel (mea_norm follows them), o_proj
row-parallel; k_proj / v_proj whole on every rank with summed gradients (every virtual head mixes all physical
heads); the HLC columns (virtual heads) split when t <= n_v, else whole with summed gradients.
"""
from __future__ import annotations

from typing import Tuple

from ..qwen3.spec import QWEN3, QWEN3_LAYER
from ..spec.params import SUMMED, LayerSpec, ModelSpec, Param, TensorShard, linear, split_kv
from .layers import is_mea_layer

__all__ = ["tensor_shapes", "MEA_LAYER", "MEA_STOCK_LAYER", "QWEN3_MEA", "mea_sizes_over", "mea_layers", "mea_model_spec",
           "HLC_PART"]


def mea_sizes_over(base_sizes):
    """The sizes function of an MEA layer over a base layer's: the base's (kv_heads = num_key_value_heads = n_p), the
    virtual heads n_v and the head-norm flag."""
    def mea_sizes(cfg, layer_idx: int):
        s = base_sizes(cfg, layer_idx)
        s.virtual, s.group_norm = cfg.mea_kv_heads, bool(getattr(cfg, "mea_group_norm", True))  # the config's default
        return s
    return mea_sizes


def _lc_init(s, cfg):
    """Virtual head j copies physical head j % n_p (GQA with n_p KV heads), plus N(0, 0.02) so the heads start apart."""
    import paddle
    from paddle import nn
    n_p, n_v = s.kv_heads, s.virtual
    tile = paddle.to_tensor([[1.0 if j % n_p == p else 0.0 for j in range(n_v)] for p in range(n_p)], dtype="float32")
    init = tile + 0.02 * paddle.randn([n_p, n_v], dtype="float32")
    return nn.initializer.Assign(init.astype(paddle.get_default_dtype()))


def _ones(s, cfg):
    from paddle import nn
    return nn.initializer.Constant(1.0)


HLC_PART = "hlc"  # the cost model's part for mea_k_lc and mea_v_lc, the head linear combination (mea/cost.py)

_kv = lambda s: s.kv_heads * s.head_dim  # noqa: E731
_lc = lambda s: (s.kv_heads, s.virtual)  # noqa: E731

def mea_layers(base: LayerSpec) -> Tuple[LayerSpec, LayerSpec]:
    """(MEA layer, stock layer with mea_stock_kv_heads KV heads) over a base's decoder layer."""
    mea = base.replace(
        f"{base.name}_mea",
        sizes=mea_sizes_over(base.sizes),
        add=(
            *linear("self_attn.k_proj", _kv, lambda s: s.h, SUMMED),  # all n_p physical heads on every rank
            *linear("self_attn.v_proj", _kv, lambda s: s.h, SUMMED),
            Param("self_attn.mea_k_lc", _lc, split_kv(TensorShard(1)), init=_lc_init),  # columns = virtual heads
            Param("self_attn.mea_v_lc", _lc, split_kv(TensorShard(1)), init=_lc_init),
            Param("self_attn.mea_norm.weight", lambda s: (s.heads * s.head_dim,), TensorShard(0),  # by query head
                  when=lambda s: s.group_norm, init=_ones),  # the head norm's affine weight
        ),
    )
    stock = base.replace(f"{base.name}_mea_stock",
                         sizes=lambda cfg, i: base.sizes(cfg, i, kv_heads=cfg.mea_stock_kv_heads))
    return mea, stock


def mea_model_spec(base: ModelSpec, mea: LayerSpec, stock: LayerSpec) -> ModelSpec:
    """An MEA family's tensors over a base's: MEA layers (`mea`) in mea_layers, stock layers (`stock`, their own KV
    heads) elsewhere; the pair from mea_layers."""
    return ModelSpec(top=base.top, top_sizes=base.top_sizes,
                     layer=lambda cfg, i: mea if is_mea_layer(cfg.mea_layers, i) else stock)


MEA_LAYER, MEA_STOCK_LAYER = mea_layers(QWEN3_LAYER)
QWEN3_MEA = mea_model_spec(QWEN3, MEA_LAYER, MEA_STOCK_LAYER)

tensor_shapes = QWEN3_MEA.tensor_shapes  # the on-disk contract: name -> HF-layout shape
