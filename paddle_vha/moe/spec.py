"""The routed-expert MLP's tensors, declared once (paddle_vha/spec/params.py), and the MoE form of any decoder-layer
spec: its dense MLP (mlp.gate_proj / up_proj / down_proj) replaced, on the MoE layers, by

    mlp.gate.weight                          [E, h]     the router (logits = x W_r^T)
    mlp.experts.{e}.gate_proj.weight         [I_e, h]   expert e's SwiGLU, e = 0 .. E-1
    mlp.experts.{e}.up_proj.weight           [I_e, h]
    mlp.experts.{e}.down_proj.weight         [h, I_e]
    mlp.shared_expert.{gate,up,down}_proj.weight        a shared expert of width I_s (upstream PaddleFleet's; named as
    mlp.shared_expert_gate.weight            [1, h]     Hugging Face's Qwen2-MoE names it), and its sigmoid gate

Names and shapes are Hugging Face Qwen3MoeForCausalLM's (Linear weights [out, in]). Dense layers among the MoE ones
(decoder_sparse_step, mlp_only_layers: paddle_vha/moe/config.py) keep the base layer's tensors. The attention is
whatever the given layer spec declares: stock Qwen3 (QWEN3_MOE) or VHA (paddle_vha/moe_vha/spec.py).
No tensor-parallel plan: these families are checkpoints only, so the shards are the default (whole).
"""
from __future__ import annotations

import functools
from types import SimpleNamespace

from ..qwen3.spec import QWEN3_LAYER, TOP, top_sizes
from ..spec.params import WHOLE, LayerSpec, ModelSpec, Param, linear
from .fields import moe_layers

__all__ = ["DENSE_MLP", "moe_params", "with_moe_mlp", "moe_model_spec", "QWEN3_MOE", "tensor_shapes"]

DENSE_MLP = ("mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")  # the base layer's MLP, dropped on MoE layers


def _swiglu(prefix: str, width, when=lambda s: True) -> tuple:
    """gate / up [width, h] and down [h, width] Linear weights under `prefix` (no biases, as Qwen3's MLP)."""
    return (*linear(f"{prefix}.gate_proj", width, lambda s: s.h, WHOLE, bias=None, when=when),
            *linear(f"{prefix}.up_proj", width, lambda s: s.h, WHOLE, bias=None, when=when),
            *linear(f"{prefix}.down_proj", lambda s: s.h, width, WHOLE, bias=None, when=when))


def moe_params(num_experts: int) -> tuple:
    """The MoE MLP's Params for E = num_experts experts (the router, each expert, the optional shared expert)."""
    expert = lambda s: s.moe_inter  # noqa: E731
    params = [Param("mlp.gate.weight", lambda s: (s.experts, s.h), linear=True)]
    for e in range(num_experts):
        params += _swiglu(f"mlp.experts.{e}", expert)
    has_shared = lambda s: s.shared_inter is not None  # noqa: E731
    params += _swiglu("mlp.shared_expert", lambda s: s.shared_inter, when=has_shared)
    params.append(Param("mlp.shared_expert_gate.weight", lambda s: (1, s.h), linear=True,
                        when=lambda s: s.shared_inter is not None and s.shared_gate))
    return tuple(params)


def _moe_sizes(dense_sizes):
    def sizes(cfg, i):
        s = dense_sizes(cfg, i)
        return SimpleNamespace(**vars(s), experts=cfg.num_experts, moe_inter=cfg.moe_intermediate_size,
                               shared_inter=cfg.moe_shared_expert_intermediate_size,
                               shared_gate=bool(cfg.moe_shared_expert_gate))
    return sizes


@functools.lru_cache(maxsize=None)
def with_moe_mlp(dense: LayerSpec, num_experts: int) -> LayerSpec:
    """The MoE form of layer spec `dense` with E = num_experts: its attention (and norms) as declared, the routed
    experts in place of its dense MLP."""
    return dense.replace(f"{dense.name}_moe", sizes=_moe_sizes(dense.sizes), drop=DENSE_MLP,
                         add=moe_params(num_experts))


def moe_model_spec(dense: LayerSpec) -> ModelSpec:
    """A family's ModelSpec: layer i is `dense` on the dense layers and its MoE form on the MoE layers."""
    def layer(cfg, i):
        return with_moe_mlp(dense, cfg.num_experts) if i in moe_layers(cfg) else dense
    return ModelSpec(top=TOP, top_sizes=top_sizes, layer=layer)


QWEN3_MOE = moe_model_spec(QWEN3_LAYER)  # stock Qwen3-MoE: GQA attention, routed experts
tensor_shapes = QWEN3_MOE.tensor_shapes  # the on-disk contract: name -> HF-layout shape
