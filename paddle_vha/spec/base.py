"""A base architecture as data: what the families derive from (PaddleFormers' dense Qwen3, Llama and Qwen2; Qwen3-MoE
at the checkpoint level). A variant (VHA, MEA) over a base is built from the base's classes, its decoder layer's spec
and its config class; nothing outside a base's own folder names it.

Paddle-free: classes are named, not imported (paddle_vha/modeling/ resolves them when it builds a family's classes).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict

from .params import LayerSpec, ModelSpec

__all__ = ["Base", "ROLES"]

# The classes a base provides, by role. A family subclasses each and fills the slots: the names the base's own
# constructors look up when they build their parts (the decoder layer builds `attention`, the backbone builds
# `decoder_layer`, the causal LM builds `model`).
# `causal_lm_pipe` is its pipeline-parallel causal LM (a PaddleFormers GeneralModelForCausalLMPipe), which takes the
# decoder layer as a class attribute rather than a slot.
ROLES = ("attention", "decoder_layer", "pretrained", "model", "causal_lm", "rotary", "causal_lm_pipe")


@dataclass(frozen=True)
class Base:
    name: str  # how messages name it: "Qwen3"
    model_type: str  # its stock checkpoints' config.json model_type ("qwen3"); a variant's is "<this>_<variant>"
    module: str  # the module holding its classes, e.g. "paddleformers.transformers.qwen3.modeling"
    classes: Dict[str, str]  # role (ROLES) -> class name in `module`
    config: str  # "module:Class" of its config
    spec: ModelSpec  # its own tensors (a variant's spec derives from them)
    layer: LayerSpec  # its dense decoder layer's tensors (what a variant's layer spec is built over)
    check_fields: Callable[[dict], None]  # config.json as written -> ValueError naming a bad field
    check_config: Callable[[Any], None]  # a built config object -> ValueError naming a bad field

    @property
    def causal_lm(self) -> str:
        """"module:Class" of its own causal LM (the stock family's model)."""
        return f"{self.module}:{self.classes['causal_lm']}"

    def has(self, layer_tensor: str) -> bool:
        """Whether its decoder layer declares `layer_tensor` ("self_attn.q_norm.weight")."""
        return any(p.name == layer_tensor for p in self.layer.params)
