"""Qwen3-MoE as a base the families name (paddle_vha/spec/base.py): its spec, its config checks, and the classes a
model would derive from. Checkpoint level: PaddleFormers 1.0.0's qwen3_moe modeling imports paddlefleet (not on
PyPI), so the factory never builds these classes here; validation, fold, import and cost take the base as data."""
from __future__ import annotations

from ..qwen3.contract import check_config, check_config_fields
from ..spec.base import Base
from .fields import check_moe_fields
from ..qwen3.spec import QWEN3_LAYER
from .spec import QWEN3_MOE

__all__ = ["QWEN3_MOE_BASE", "NO_MODEL"]

# Why a Qwen3-MoE family has no Paddle model here (Family.model_class says it in one line).
NO_MODEL = ("PaddleFormers 1.0.0's qwen3_moe modeling imports paddlefleet, which is not on PyPI; Qwen3-MoE checkpoints "
            "are validated, folded, imported and costed here, not trained or run")


def _check_fields(fields: dict) -> None:
    check_config_fields(fields)
    check_moe_fields(fields, fields.get("num_hidden_layers"))


QWEN3_MOE_BASE = Base(
    name="Qwen3-MoE",
    model_type="qwen3_moe",
    module="paddleformers.transformers.qwen3_moe.modeling",
    classes=dict(attention="Qwen3MoeAttention", decoder_layer="Qwen3MoeDecoderLayer",
                 pretrained="Qwen3MoePretrainedModel", model="Qwen3MoeModel", causal_lm="Qwen3MoeForCausalLM"),
    config="paddle_vha.moe.config:Qwen3MoeConfig",
    spec=QWEN3_MOE,
    layer=QWEN3_LAYER,  # its attention and norms (the MLP of a MoE layer is swapped: moe/spec.py)
    check_fields=_check_fields,
    check_config=check_config,  # the typed config's MoE fields are checked by MoEFields when it is built
)
