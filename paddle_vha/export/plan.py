"""The serving plan: what one export needs to know about its checkpoint, resolved once at its start.

`serving_plan(folder, cache_io)` opens the checkpoint folder, asks the family registry (paddle_vha/families.py) for
the family, refuses what the export cannot serve as it is (a family without a serving form, a config its form
refuses, tensors that do not meet the contract), and keeps the answers: the config, the opened CheckpointFolder,
every layer's cache shapes, names and sliding window, the graph's I/O names, the onnxruntime-genai decoder type and
why genai cannot run the export (if it cannot). The decoder, the graph clean-up, the validation and the genai files
read the plan; none of them reopens the folder or asks the registry again.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Optional, Tuple

from ..checkpoint.contract import CheckpointError
from ..checkpoint.folder import CheckpointFolder
from ..families import Family, family_of
from ..qwen3.contract import sliding_window_layers
from ..qwen3.rope_scaling import rope_scaling_of

__all__ = ["ServingPlan", "serving_plan", "io_names", "cache_windows", "CACHE_IO"]

CACHE_IO = ("concat", "buffer")


def io_names(num_layers: int, cache_names=None, cache_io: str = "concat"):
    """Graph input and output names; cache_names: per layer the names of its cache tensors (default key and value);
    cache_io "buffer" names the outputs new.{i}.* (the new positions only) instead of present.{i}.*."""
    cache_names = cache_names or [("key", "value")] * num_layers
    out = "present" if cache_io == "concat" else "new"
    past = [f"past_key_values.{i}.{kv}" for i in range(num_layers) for kv in cache_names[i]]
    present = [f"{out}.{i}.{kv}" for i in range(num_layers) for kv in cache_names[i]]
    return ["input_ids", "attention_mask", "position_ids"] + past, ["logits"] + present


def cache_windows(cfg) -> List[Optional[int]]:
    """Per layer the sliding window W of its attention (its cache keeps the last W - 1 positions), or None."""
    windows = set(sliding_window_layers(cfg))
    return [int(cfg.sliding_window) if i in windows else None for i in range(cfg.num_hidden_layers)]


@dataclass(frozen=True)
class ServingPlan:
    """One servable checkpoint as one export serves it (see the module docstring)."""

    folder: CheckpointFolder  # opened once; .config is the raw config.json dict
    family: Family
    config: Any  # the family's typed config
    cache_io: str  # "concat" or "buffer" (paddle_vha/export/decoder.py)
    cache_shapes: List[Tuple[int, int]]  # per layer (heads, width) of its cache tensors
    cache_names: List[Tuple[str, ...]]  # per layer ("key", "value"), or ("key",) for one K = V tensor
    cache_windows: List[Optional[int]]  # per layer its sliding window, or None
    genai_model_type: Optional[str]  # onnxruntime-genai's decoder type for the family (None: it has none)
    genai_refusal: Optional[str]  # why genai cannot run this export, or None

    @property
    def num_layers(self) -> int:
        return self.config.num_hidden_layers

    @property
    def cache_inputs(self) -> List[Tuple[int, int]]:
        """(heads, width) of every cache input of the graph, in order."""
        return [tuple(shape) for shape, names in zip(self.cache_shapes, self.cache_names) for _ in names]

    @property
    def input_windows(self) -> List[Optional[int]]:
        """The sliding window of every cache input of the graph, in order."""
        return [w for w, names in zip(self.cache_windows, self.cache_names) for _ in names]

    @property
    def io_names(self):
        """(input names, output names) of the graph."""
        return io_names(self.num_layers, self.cache_names, self.cache_io)

    @property
    def rope(self):
        """The config's RoPE and its scaling (paddle_vha/qwen3/rope_scaling.py); serving_plan checked it."""
        return rope_scaling_of(self.config)

    def export_form(self, layer_idx: int, tensors, const):
        """Layer `layer_idx`'s form in the exported decoder (the family's serving module builds it)."""
        return self.family.export_form(self.config, layer_idx, tensors, const)


def serving_plan(src, cache_io: str = "concat") -> ServingPlan:
    """The plan for exporting checkpoint `src` (a path or an opened CheckpointFolder) with cache interface
    `cache_io`; CheckpointError (one line) if the export cannot serve it as it is."""
    from .genai import genai_refusal

    ck = CheckpointFolder.open(src)
    fam = family_of(ck)
    if not fam.servable:  # refused before its config is even parsed: nothing of it is served
        raise CheckpointError(f"{ck.path}: is a {fam.label} checkpoint; {fam.not_exported}")
    cfg = fam.load_config(ck)
    try:  # a RoPE scaling the graph does not implement: refused before anything is exported
        rope_scaling_of(cfg)
    except ValueError as e:
        raise CheckpointError(f"{ck.path}: {e}") from None
    why = fam.export_refusal(cfg)
    if why:
        raise CheckpointError(f"{ck.path}: {why}")
    fam.check_tensors(ck, cfg)
    ck.require_float()  # an integer tensor is refused by type here, not by the validation's tolerance
    shapes = [tuple(s) for s in fam.export_cache_shapes(cfg)]
    names = [tuple(n) for n in fam.export_cache_names(cfg)]
    windows = cache_windows(cfg)
    genai_type = fam.genai_model_type
    return ServingPlan(folder=ck, family=fam, config=cfg, cache_io=cache_io, cache_shapes=shapes, cache_names=names,
                       cache_windows=windows, genai_model_type=genai_type,
                       genai_refusal=genai_refusal(cfg, fam.label, genai_type, names, shapes, windows, cache_io))
