"""The family registry: one entry per model family, keyed by config.json's `model_type` (torchtitan's ModelSpec).

    from paddle_vha.families import family, family_of
    fam = family("qwen3_vha")            # or family_of(checkpoint_folder), family_of(config_object)
    cfg = fam.validate("runs/quickstart/vha")       # config, checked against the family's tensor contract
    model = fam.model_class(cfg)

An entry says everything the shared code needs to know about a family: its config and model classes, its tensor
contract, its tensor-parallel plan, how it is served (the export's per-layer cache layout, or why it is not exported
as is) and its cost model. Shared modules (checkpoint loading, parallel, export, accounting, train) ask this registry;
none of them imports a family by name, and no `model_type` string appears outside this file and the family folders
(tests/test_architecture.py checks both). A new family or variant touches its own folder and its entry below.

Entries name Paddle-dependent pieces as "module:attribute" strings, imported on first use, so the registry (and the
calculators built on it) import without Paddle.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType
from typing import Dict, List, Optional

from .checkpoint.contract import CheckpointError, Shapes, compare_shapes
from .checkpoint.folder import CheckpointFolder
from .llama.base import LLAMA_BASE
from .llama.gguf import LLAMA_GGUF
from .llama.spec import LLAMA, LLAMA_MEA, LLAMA_VHA
from .mea import cost as mea_cost
from .mea import tp_plan as mea_tp_plan
from .mea.spec import QWEN3_MEA
from .moe.base import NO_MODEL, QWEN3_MOE_BASE
from .moe.spec import QWEN3_MOE
from .moe_vha.spec import QWEN3_MOE_VHA
from .qwen2.base import QWEN2_BASE
from .qwen2.gguf import QWEN2_GGUF
from .qwen2.spec import QWEN2, QWEN2_MEA, QWEN2_VHA
from .qwen3 import cost as qwen3_cost
from .qwen3.base import QWEN3_BASE
from .qwen3.gguf import QWEN3_GGUF
from .qwen3.spec import QWEN3
from .shared_kv import cost as shared_kv_cost
from .shared_kv import tp_plan as shared_kv_tp_plan
from .shared_kv.spec import QWEN3_SHARED_KV
from .sinks import cost as sinks_cost
from .sinks import tp_plan as sinks_tp_plan
from .sinks.spec import QWEN3_SINKS
from .spec.base import Base
from .spec.gguf import GGUFForm, GGUFPre
from .spec.params import ModelSpec
from .spec.validate import check_layer_count, load_config, validate
from .vha import cost as vha_cost
from .vha import tp_plan as vha_tp_plan
from .vha.spec import QWEN3_VHA

__all__ = ["Family", "load_float32_model", "FAMILIES", "DEFAULT_MODEL_TYPE", "family", "family_of", "UnknownFamily", "variant_over",
           "convertible", "GGUF_FORMS", "GGUF_BPE", "GGUF_SENTENCEPIECE", "gguf_form", "gguf_form_of", "gguf_pre"]


class UnknownFamily(CheckpointError):
    """A model_type no entry describes; one line naming it and the known ones."""


def _resolve(ref: str):
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)


@dataclass(frozen=True)
class Family:
    """One model family. Callables take the family's config object unless said otherwise."""

    model_type: str
    label: str  # how messages name it: "Qwen3-VHA"
    config_ref: str  # "module:Class" of the config (a PaddleFormers PretrainedConfig)
    model_ref: Optional[str]  # "module:Class" of the causal LM; None: a checkpoint-level family (no Paddle model)
    spec: ModelSpec  # its tensors, declared once (paddle_vha/spec/params.py): contract, shards, checkpoint rules
    # Tensor parallelism through paddle_vha.parallel: a module with check(cfg, t) and layer_plan(cfg, t, rank, i) ->
    # parallel.plan.LayerPlan; None: the family is not sharded by this project.
    tp_plan: Optional[ModuleType] = None
    # Serving: "module:attribute" of a qwen3.serving.Serving (its layers' form in the exported decoder, cache shapes
    # and names, the refusal, genai's decoder type); the graph constants come from the spec (Param.serve). A family
    # without one is not exported; `not_exported` says what to do.
    serving_ref: Optional[str] = None
    not_exported: str = "cannot be exported"
    # Cost model (paddle_vha/accounting.py): a module with arch_fields(config.json dict, common fields) -> the Arch
    # fields of its attention; importing it registers its attention kinds' formulas (paddle_vha/spec/cost.py).
    cost: Optional[ModuleType] = None
    base: Base = QWEN3_BASE  # what its classes derive from (paddle_vha/spec/base.py)
    # Fold (paddle_vha/transform/fold.py): "module:attribute" of what its checkpoints fold into (refusals, folded
    # model_type and config.json, notes, the plan's header: vha/fold_form.py); the tensors' fold roles are its spec's.
    # None: the family is not folded.
    fold_ref: Optional[str] = None
    architecture: Optional[str] = None  # config.json's architectures entry, where the causal LM is not model_ref's
    variant: Optional[str] = None  # "vha", "mea": the variant over `base` a converter writes (None: stock or other)

    def tensor_shapes(self, cfg) -> Shapes:
        """The on-disk tensor contract for config `cfg`: name -> HF-layout shape."""
        return self.spec.tensor_shapes(cfg)

    @property
    def config_class(self):
        return _resolve(self.config_ref)

    @property
    def fold_form(self):
        """What this family's checkpoints fold into (None: not folded)."""
        return _resolve(self.fold_ref) if self.fold_ref else None

    @property
    def causal_lm_name(self) -> str:
        """The causal LM class config.json's `architectures` names (what Hugging Face loads)."""
        return self.architecture or self.model_ref.rpartition(":")[2]

    @property
    def stock(self) -> bool:
        """Whether the family is its base's own model (stock Qwen3, stock Qwen3-MoE), not a variant of it."""
        return self.spec is self.base.spec

    @property
    def has_model(self) -> bool:
        """Whether this project builds a Paddle model of the family (False: checkpoints only, e.g. Qwen3-MoE)."""
        return self.model_ref is not None

    @property
    def model_class(self):
        if self.model_ref is None:
            raise CheckpointError(f"{self.label} has no Paddle model here: {NO_MODEL}")
        return _resolve(self.model_ref)

    @property
    def pipe_class(self):
        """The causal LM's pipeline-parallel form (paddle_vha/modeling/pipe.py), or None if the family has none."""
        return getattr(self.model_class, "pipe_class", None) if self.has_model else None

    @property
    def servable(self) -> bool:
        """Whether the export serves checkpoints of this family as they are (else see `not_exported`)."""
        return self.serving_ref is not None

    @property
    def _serving(self):
        return _resolve(self.serving_ref)

    def export_refusal(self, cfg) -> Optional[str]:
        """Why the checkpoint with config `cfg` (of a servable family) cannot be exported as it is, or None."""
        return self._serving.refusal(cfg)

    @property
    def genai_model_type(self) -> Optional[str]:
        """onnxruntime-genai's decoder type for this family's exports (None: genai has none that runs them)."""
        return self._serving.genai_model_type if self.servable else None

    def export_form(self, cfg, layer_idx: int, tensors, const):
        """Layer `layer_idx`'s form in the exported decoder (paddle_vha/export/decoder.py): the serving's form, with
        the tensors the spec serves as graph constants (`Param.serve`) on it."""
        form = self._serving.build(cfg, layer_idx, tensors, const)
        for name, attribute in self.spec.served_constants(cfg, layer_idx).items():
            setattr(form, attribute, const(tensors[name]))
        return form

    def export_cache_shapes(self, cfg) -> List[tuple]:
        """(heads, width) of every layer's cache tensors in the exported decoder."""
        return [self._serving.cache_shape(cfg, i) for i in range(cfg.num_hidden_layers)]

    def export_cache_names(self, cfg) -> List[tuple]:
        """The names of every layer's cache tensors in the exported decoder: ("key", "value"), or ("key",)."""
        return [self._serving.cache_names for _ in range(cfg.num_hidden_layers)]

    def load_config(self, folder):
        """The typed config of a checkpoint folder of this family; config errors become one-line CheckpointErrors."""
        return load_config(folder, self.model_type, self.label, self.config_class, self.base)

    def check_tensors(self, folder, cfg) -> None:
        """CheckpointError naming missing, unexpected or mis-shaped tensors (headers only) for config `cfg`."""
        ck = CheckpointFolder.open(folder)
        check_layer_count(ck, cfg)
        compare_shapes(ck.path, ck.shapes, self.tensor_shapes(cfg))

    def validate(self, folder):
        """Check a checkpoint folder against this family's contract (config, then tensor names and shapes from the
        headers); returns its config."""
        return validate(folder, self.model_type, self.label, self.config_class, self.base, self.spec)


def _stock_and_variants(base: Base, prefix: str, spec: ModelSpec, vha_spec: ModelSpec, mea_spec: ModelSpec,
                        serving_ref: str, model_ref: Optional[str] = None) -> tuple:
    """A dense base's stock family and its VHA and MEA families (their classes in paddle_vha/<base>/vha.py and
    mea.py, named `prefix` + "VHAConfig", ...): the Qwen3 entries below, over another base."""
    here = f"paddle_vha.{base.model_type}"
    return (
        Family(model_type=base.model_type, label=base.name, config_ref=base.config, model_ref=model_ref or base.causal_lm,
               spec=spec, cost=qwen3_cost, serving_ref=serving_ref, base=base),
        Family(model_type=f"{base.model_type}_vha", label=f"{base.name}-VHA", config_ref=f"{here}.vha:{prefix}VHAConfig",
               model_ref=f"{here}.vha:{prefix}VHAForCausalLM", spec=vha_spec, tp_plan=vha_tp_plan.VHAPlan(vha_spec),
               not_exported="fold it first (python tools/fold.py IN OUT)", cost=vha_cost,
               fold_ref=f"{here}.vha:{base.model_type.upper()}_VHA_FOLD", base=base, variant="vha"),
        Family(model_type=f"{base.model_type}_mea", label=f"{base.name}-MEA", config_ref=f"{here}.mea:{prefix}MEAConfig",
               model_ref=f"{here}.mea:{prefix}MEAForCausalLM", spec=mea_spec, tp_plan=mea_tp_plan.MEAPlan(mea_spec),
               serving_ref="paddle_vha.mea.serving:MEA", cost=mea_cost, base=base, variant="mea"),
    )


FAMILIES: Dict[str, Family] = {
    f.model_type: f
    for f in (
        Family(
            model_type="qwen3",
            label="Qwen3",
            config_ref="paddleformers.transformers:Qwen3Config",
            model_ref="paddleformers.transformers:Qwen3ForCausalLM",
            spec=QWEN3,
            cost=qwen3_cost,
            serving_ref="paddle_vha.qwen3.serving:STOCK_QWEN3",
        ),
        Family(
            model_type="qwen3_vha",
            label="Qwen3-VHA",
            config_ref="paddle_vha.vha.config:Qwen3VHAConfig",
            model_ref="paddle_vha.vha.modeling:Qwen3VHAForCausalLM",
            spec=QWEN3_VHA,
            tp_plan=vha_tp_plan,
            not_exported="fold it first (python tools/fold.py IN OUT)",
            cost=vha_cost,
            fold_ref="paddle_vha.vha.fold_form:VHA_FOLD",
            variant="vha",
        ),
        Family(
            model_type="qwen3_mea",
            label="Qwen3-MEA",
            config_ref="paddle_vha.mea.config:Qwen3MEAConfig",
            model_ref="paddle_vha.mea.modeling:Qwen3MEAForCausalLM",
            spec=QWEN3_MEA,
            tp_plan=mea_tp_plan,
            serving_ref="paddle_vha.mea.serving:MEA",
            cost=mea_cost,
            variant="mea",
        ),
        Family(
            model_type="qwen3_shared_kv",
            label="Qwen3 shared-KV",
            config_ref="paddle_vha.shared_kv.config:Qwen3SharedKVConfig",
            model_ref="paddle_vha.shared_kv.modeling:Qwen3SharedKVForCausalLM",
            spec=QWEN3_SHARED_KV,
            tp_plan=shared_kv_tp_plan,
            serving_ref="paddle_vha.shared_kv.serving:SHARED_KV",
            cost=shared_kv_cost,
        ),
        Family(
            model_type="qwen3_moe",
            label="Qwen3-MoE",
            config_ref="paddle_vha.moe.config:Qwen3MoeConfig",
            model_ref=None,
            spec=QWEN3_MOE,
            cost=qwen3_cost,
            base=QWEN3_MOE_BASE,
            architecture="Qwen3MoeForCausalLM",
            not_exported=("the exported decoder has no routed experts (no top-k gating in its graph); serve it with a "
                          "runtime that runs Qwen3-MoE (Hugging Face Qwen3MoeForCausalLM, vLLM, SGLang)"),
        ),
        Family(
            model_type="qwen3_moe_vha",
            label="Qwen3-MoE-VHA",
            config_ref="paddle_vha.moe_vha.config:Qwen3MoeVHAConfig",
            model_ref=None,
            spec=QWEN3_MOE_VHA,
            cost=vha_cost,
            base=QWEN3_MOE_BASE,
            fold_ref="paddle_vha.moe_vha.fold_form:MOE_VHA_FOLD",
            not_exported=("fold it first (python tools/fold.py IN OUT: a stock Qwen3-MoE checkpoint), then serve that "
                          "with a runtime that runs Qwen3-MoE; the exported decoder has no routed experts"),
        ),
        Family(
            model_type="qwen3_sinks",
            label="Qwen3 with sinks",
            config_ref="paddle_vha.sinks.config:Qwen3SinksConfig",
            model_ref="paddle_vha.sinks.modeling:Qwen3SinksForCausalLM",
            spec=QWEN3_SINKS,
            tp_plan=sinks_tp_plan,
            serving_ref="paddle_vha.qwen3.serving:GQA",
            cost=sinks_cost,
        ),
        *_stock_and_variants(LLAMA_BASE, "Llama", LLAMA, LLAMA_VHA, LLAMA_MEA, "paddle_vha.llama.serving:STOCK_LLAMA",
                             model_ref="paddle_vha.llama.modeling:LlamaForCausalLM"),
        *_stock_and_variants(QWEN2_BASE, "Qwen2", QWEN2, QWEN2_VHA, QWEN2_MEA, "paddle_vha.qwen2.serving:STOCK_QWEN2"),
    )
}

# What tools/train.py builds when a trainer config names no model_type.
DEFAULT_MODEL_TYPE = "qwen3_vha"


def family(model_type) -> Family:
    """The entry for `model_type`; UnknownFamily (a one-line CheckpointError) if there is none."""
    if model_type not in FAMILIES:
        raise UnknownFamily(f"model_type {model_type!r} is not one of {', '.join(FAMILIES)}")
    return FAMILIES[model_type]


def family_of(obj) -> Family:
    """The entry for a config object, a config.json dict, a CheckpointFolder or a checkpoint folder path."""
    if isinstance(obj, dict):
        return family(obj.get("model_type"))
    if isinstance(obj, CheckpointFolder) or isinstance(obj, str):
        ck = CheckpointFolder.open(obj)
        try:
            return family(ck.model_type)
        except UnknownFamily:
            raise UnknownFamily(f"{ck.path}: config.json model_type {ck.model_type!r} is not one of "
                                f"{', '.join(FAMILIES)}") from None
    return family(getattr(obj, "model_type", None))


def variant_over(base: Base, variant: str) -> Optional[Family]:
    """The family of `variant` ("vha", "mea") over `base` (what a converter of its stock checkpoints writes), or None."""
    return next((f for f in FAMILIES.values() if f.base is base and f.variant == variant and f.has_model), None)


def convertible(variant: str) -> List[Family]:
    """The stock families whose checkpoints convert into `variant` (a Paddle model, and the variant over its base)."""
    return [f for f in FAMILIES.values() if f.stock and f.has_model and variant_over(f.base, variant) is not None]


def trainable_with_plan() -> List[Family]:
    """Families paddle_vha.parallel shards (their label in messages)."""
    return [f for f in FAMILIES.values() if f.tp_plan is not None]


# llama.cpp's names (tokenizer.ggml.model) of the vocabularies tools/import_gguf.py converts: a byte-level BPE with
# merges, and the SentencePiece-style one with scores and byte fallback (named after Llama 1 / 2, whose tokenizer it is)
GGUF_BPE, GGUF_SENTENCEPIECE = "gpt2", "llama"

# The GGUF architectures tools/import_gguf.py reads: llama.cpp's general.architecture -> the base's GGUFForm.
GGUF_FORMS: Dict[str, GGUFForm] = {f.arch: f for f in (LLAMA_GGUF, QWEN2_GGUF, QWEN3_GGUF)}


def gguf_form(arch) -> GGUFForm:
    """The GGUF form of llama.cpp architecture `arch`; UnknownFamily (one line) if no base reads it."""
    if arch not in GGUF_FORMS:
        raise UnknownFamily(f"GGUF architecture {arch!r} is not one of {', '.join(GGUF_FORMS)}")
    return GGUF_FORMS[arch]


def gguf_form_of(model_type) -> Optional[GGUFForm]:
    """The GGUF form whose imported checkpoints have `model_type` (what llama.cpp's converter reads back), or None."""
    return next((f for f in GGUF_FORMS.values() if f.model_type == model_type), None)


def gguf_pre(name) -> Optional[GGUFPre]:
    """The byte-level BPE pre-tokenizer llama.cpp calls `name` (tokenizer.ggml.pre), from the bases' GGUF forms; None
    for one no base describes."""
    return next((p for f in GGUF_FORMS.values() for p in f.pre_tokenizers if p.name == name), None)


def load_float32_model(folder):
    """(model, config) of any registered family from a checkpoint folder: the family read from config.json, the folder
    checked by its contract, the model built and loaded in float32 (what the studies, the healing report and the
    healing profile evaluate)."""
    from .checkpoint.folder import CheckpointFolder
    from .checkpoint.load import load_tensors_into

    ck = CheckpointFolder.open(folder)
    fam = family_of(ck)
    cfg = fam.validate(ck)
    cfg.dtype = "float32"
    model = fam.model_class(cfg)
    load_tensors_into(model, ck.read_all(float32=True), source=folder)
    return model, cfg
