"""The Qwen3-MoE fields (Hugging Face's names) on top of a Qwen3 config class, validated with one-line errors.

    num_experts              E routed experts per MoE layer
    num_experts_per_tok      k experts a token is routed to (1 <= k <= E)
    moe_intermediate_size    I_e, the width of one expert's SwiGLU
    decoder_sparse_step      layer i is MoE when (i + 1) % step == 0 ...
    mlp_only_layers          ... and i is not listed here (those keep the dense MLP of width intermediate_size)
    norm_topk_prob           renormalise the k routing weights to sum to 1 (else the softmax values as they are)
    moe_shared_expert_intermediate_size, moe_shared_expert_gate
                             upstream PaddleFleet's shared expert (a SwiGLU of that width every token goes through,
                             optionally scaled by sigmoid(x w_g)); stock Qwen3-MoE has none (None, False)

The router is softmax over E logits (x W_r^T, W_r [E, h]), top-k, optional renormalisation; a MoE layer's output is
sum_j p_j * SwiGLU_{e_j}(x) (+ the shared expert).
"""
from __future__ import annotations

from paddleformers.transformers import Qwen3Config

from .fields import HF_DEFAULTS, MoEConfigError, check_moe_fields, moe_layers

__all__ = ["MoEFields", "MoEConfigError", "Qwen3MoeConfig", "moe_layers", "check_moe_fields", "HF_DEFAULTS"]

class MoEFields:
    """Mixed in before a Qwen3 config class: pops the MoE fields (HF_DEFAULTS for those not given), lets the Qwen3
    class take the rest, then validates them (MoEConfigError, one line)."""

    def __init__(self, **kwargs):
        moe = {k: kwargs.pop(k, v) for k, v in HF_DEFAULTS.items()}
        super().__init__(**kwargs)
        moe["mlp_only_layers"] = [] if moe["mlp_only_layers"] is None else moe["mlp_only_layers"]
        check_moe_fields(moe, getattr(self, "num_hidden_layers", None))
        for k, v in moe.items():
            setattr(self, k, v)

    @property
    def moe_layer_indices(self) -> list:
        return moe_layers(self)

    @property
    def has_shared_expert(self) -> bool:
        return self.moe_shared_expert_intermediate_size is not None

    def experts_line(self) -> str:
        """The routed experts in words (the plans of fold and import_fleet start their MoE line with it)."""
        return (f"routed experts: {self.num_experts} per MoE layer, top-{self.num_experts_per_tok}, width "
                f"{self.moe_intermediate_size}, norm_topk_prob {self.norm_topk_prob}")


class Qwen3MoeConfig(MoEFields, Qwen3Config):
    r"""Stock Qwen3-MoE (Hugging Face's `qwen3_moe`): Qwen3Config's fields plus the MoE fields above; what a
    Qwen3-MoE-VHA checkpoint folds into. It has no shared expert (Hugging Face's Qwen3-MoE has none)."""

    model_type = "qwen3_moe"

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        if self.has_shared_expert:
            raise MoEConfigError("moe_shared_expert_intermediate_size is set: stock Qwen3-MoE has no shared expert")
