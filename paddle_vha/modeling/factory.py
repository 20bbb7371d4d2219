"""One factory for every family's model classes: (base, variant) -> decoder layer, pretrained, backbone, causal LM and
its pipeline-parallel form.

Each class subclasses the base's own (PaddleFormers' Qwen3 classes for QWEN3_BASE) and deviates in one place each:

    DecoderLayer  the base's layer, built with the variant's attention in its attention slot
    Pretrained    config_class, and checkpoints checked against the variant's declared tensors (ContractCheckpointMixin)
    Model         refuses unsupported runtime options first; the base's backbone built with DecoderLayer in its layer
                  slot; the variant's mixins before it (forward deviations); the variant's rotary embedding if it has one
    CausalLM      the base's causal LM built with Model in its backbone slot
    Pipe          the base's pipeline-parallel causal LM with DecoderLayer in its stages (paddle_vha/modeling/pipe.py);
                  also CausalLM.pipe_class

No base constructor body is copied (paddle_vha/modeling/slots.py). The backbone and causal LM call their base class's
constructor by name, not through super(): PaddleFormers' InitTrackerMeta gives every PretrainedModel subclass an
__init__ of its own (a wrapper of the one it inherits when the class is made), so from a class whose first base is the
family's Pretrained, super().__init__ would reach PretrainedModel.__init__ and skip the backbone's. The factory reads the base only through its
`Base` description (paddle_vha/spec/base.py), so another base (a MoE or a pipeline model) is another description.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple, Optional, Tuple

from ..spec.base import Base
from ..spec.params import ModelSpec
from .checkpointing import ContractCheckpointMixin
from .pipe import build_pipe
from .slots import filled_slots

__all__ = ["Variant", "FamilyClasses", "build_family"]


@dataclass(frozen=True)
class Variant:
    """What a family changes in its base."""

    prefix: str  # class names: prefix + "DecoderLayer", "PretrainedModel", "Model", "ForCausalLM"
    label: str  # how messages name it: "Qwen3-VHA"
    config_class: type
    spec: ModelSpec  # its tensors
    attention: Callable[[Any, int], type]  # (config, layer index) -> the attention class of that layer
    module: str  # the module the classes belong to (their __module__)
    model_mixins: Tuple[type, ...] = ()  # put before the base backbone: its forward deviations
    rotary: Optional[Callable[[Any], Any]] = None  # config -> the backbone's rotary embedding (None: the base's)


class FamilyClasses(NamedTuple):
    decoder_layer: type
    pretrained: type
    model: type
    causal_lm: type
    pipe: type  # the causal LM as PaddleFormers' GeneralModelForCausalLMPipe, for pipeline parallelism


def _named(cls: type, variant: Variant, suffix: str) -> type:
    cls.__name__ = cls.__qualname__ = variant.prefix + suffix
    cls.__module__ = variant.module
    return cls


def build_family(base: Base, variant: Variant) -> FamilyClasses:
    """The model classes of `variant` over `base`, registered with PaddleFormers' Auto classes."""
    from paddleformers.transformers import AutoConfig, AutoModelForCausalLM
    from paddleformers.transformers.model_utils import register_base_model

    mod = importlib.import_module(base.module)
    parent = {role: getattr(mod, name) for role, name in base.classes.items()}
    slot = base.classes

    class DecoderLayer(parent["decoder_layer"]):
        def __init__(self, config, layer_idx: int):
            with filled_slots(mod, {slot["attention"]: variant.attention(config, layer_idx)}):
                super().__init__(config, layer_idx)  # the base's layer, with the variant's attention

    class Pretrained(ContractCheckpointMixin, parent["pretrained"]):
        config_class = variant.config_class
        family_spec, family_base, family_label = variant.spec, base, variant.label

    class Model(Pretrained, *variant.model_mixins, parent["model"]):
        def __init__(self, config):
            check = getattr(config, "check_runtime_support", None)
            if check is not None:
                check()  # refuse unsupported runtime options before building anything
            with filled_slots(mod, {slot["decoder_layer"]: DecoderLayer}):
                parent["model"].__init__(self, config)  # the base's backbone, with the variant's decoder layers
            rotary = variant.rotary(config) if variant.rotary is not None else None
            if rotary is not None:
                self.rotary_emb = rotary  # also the tables of layers the base's embedding does not serve

    class CausalLM(Pretrained, parent["causal_lm"]):
        def __init__(self, config):
            with filled_slots(mod, {slot["model"]: Model}):
                parent["causal_lm"].__init__(self, config)  # the base's causal LM, with the variant's backbone

    layer, causal_lm = _named(DecoderLayer, variant, "DecoderLayer"), _named(CausalLM, variant, "ForCausalLM")
    causal_lm.pipe_class = build_pipe(parent["causal_lm_pipe"], variant, layer, causal_lm)
    classes = FamilyClasses(layer, _named(Pretrained, variant, "PretrainedModel"),
                            register_base_model(_named(Model, variant, "Model")), causal_lm, causal_lm.pipe_class)
    # PaddleFormers 1.0.0 keeps one config -> model table for all Auto model classes, and its from_pretrained matches
    # `architectures` against built-in name prefixes first ("Qwen3VHA..." -> stock Qwen3), so checkpoints load
    # through the family's own from_pretrained (docs/method.md, "Auto classes").
    AutoConfig.register(variant.config_class.model_type, variant.config_class, exist_ok=True)
    AutoModelForCausalLM.register(variant.config_class, classes.causal_lm, exist_ok=True)
    return classes
