"""A family's pipeline-parallel causal LM: the base's own pipe class (PaddleFormers' `GeneralModelForCausalLMPipe`
subclass, `Qwen3ForCausalLMPipe` for QWEN3_BASE) with the family's decoder layer in it.

PaddleFormers builds a pipe model as a sequence of layer descriptions (embedding, one `DecoderLayerPipe` per decoder
layer, norm, LM head) that fleet's `PipelineLayer` cuts into stages; `make_decoder_layer_pipe(cls)` turns the decoder
layer class into a stage layer that passes (hidden states, positions, RoPE tables) along. The family's pipe sets that
class to the family's decoder layer (its attention, its parameters and their names: `model.layers.i.*`, as the plain
causal LM), and the checkpoint name rules and weight init to the family's. Two deviations from the stock pipe:

* the causal mask. Without an attention mask PaddleFormers' pipe passes none to the layers, and its eager attention
  backend then attends to every position (no causal mask at all); the plain model builds one from the config
  (`create_causal_mask_and_row_indices`). The family's pipe layer builds the same one in each layer, so every backend
  sees what it sees in the plain model (the sdpa / flash backends get None and mask causally themselves).
* refusals, one line each: sliding-window layers (the pipe builds no sliding-window mask) and layers whose RoPE
  tables differ from the model's (the pipe's embedding stage computes one pair of tables).

Built by paddle_vha/modeling/factory.py for every family (`FamilyClasses.pipe`); the Trainer uses it at
pipeline_model_parallel_size > 1 (paddle_vha/train/trainer.py). Needs fleet's hybrid topology (fleet.init) to build.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Optional

from .checkpointing import declare_tp_shards

__all__ = ["build_pipe", "causal_mask", "count_shared_weights_once", "load_stage_weights"]


def causal_mask(layer, hidden_states) -> Optional[Any]:
    """The attention mask the plain backbone gives a full-attention layer for hidden states (B, S, D) and no cache:
    PaddleFormers' own causal mask for the eager backend, None for backends that mask causally themselves."""
    from paddleformers.transformers.masking_utils import create_causal_mask_and_row_indices

    batch, seq = hidden_states.shape[:2]
    mask, _ = create_causal_mask_and_row_indices(
        config=layer.config, inputs_embeds=hidden_states, batch_size=batch, seq_length=seq, cache_length=0,
        prepare_decoder_attention_mask=layer._prepare_decoder_attention_mask)
    return mask


def _causal_decoder_layer(decoder_layer: type) -> type:
    """`decoder_layer` whose forward, given neither an attention mask nor mask row indices, uses causal_mask."""
    from paddleformers.transformers.model_utils import PretrainedModel

    class CausalDecoderLayer(decoder_layer):
        _prepare_decoder_attention_mask = staticmethod(PretrainedModel._prepare_decoder_attention_mask)

        def forward(self, hidden_states, attention_mask=None, attn_mask_startend_row_indices=None, **kwargs):
            if attention_mask is None and attn_mask_startend_row_indices is None:
                attention_mask = causal_mask(self, hidden_states)
            return super().forward(hidden_states, attention_mask=attention_mask,
                                   attn_mask_startend_row_indices=attn_mask_startend_row_indices, **kwargs)

    CausalDecoderLayer.__name__ = CausalDecoderLayer.__qualname__ = decoder_layer.__name__
    CausalDecoderLayer.__module__ = decoder_layer.__module__
    return CausalDecoderLayer


def _refusal(config, variant) -> Optional[str]:
    """Why the pipe cannot run `config` exactly as the plain model does, or None."""
    if "sliding_attention" in (getattr(config, "layer_types", None) or []):
        return "sliding-window layers (PaddleFormers' pipe model builds no sliding-window mask)"
    if variant.rotary is not None and variant.rotary(config) is not None:
        return "layers with their own head width or RoPE base (the pipe's embedding stage computes one RoPE table)"
    return None


def build_pipe(parent: type, variant, decoder_layer: type, causal_lm: type) -> type:
    """The pipeline-parallel causal LM of `variant`: a subclass of the base's pipe class `parent` whose decoder layers
    are `decoder_layer` (wrapped by _causal_decoder_layer), with `causal_lm`'s checkpoint rules and weight init."""
    from paddleformers.nn.pp_model import make_decoder_layer_pipe

    class Pipe(parent):
        config_class = variant.config_class
        _decoder_layer_cls = decoder_layer
        _decoder_layer_pipe_cls = make_decoder_layer_pipe(_causal_decoder_layer(decoder_layer))
        _init_weights = causal_lm._init_weights
        _gen_aoa_config = causal_lm._gen_aoa_config
        _gen_inv_aoa_config = causal_lm._gen_inv_aoa_config
        family_spec, family_label, causal_lm_class = variant.spec, variant.label, causal_lm

        def __init__(self, config, **kwargs):
            check = getattr(config, "check_runtime_support", None)
            if check is not None:
                check()  # fused qkv, sequence parallel, fleet tensor parallel: refused as by the plain model
            why = _refusal(config, variant)
            if why is not None:
                raise config.runtime_error(f"pipeline parallelism: {variant.label} with {why} is not supported") \
                    if hasattr(config, "runtime_error") else ValueError(f"pipeline parallelism: {why}")
            object.__setattr__(self, "_stage_config", None)  # before nn.Layer's own __init__ has run
            parent.__init__(self, config, **kwargs)
            self.config.tensor_model_parallel_size = 1  # the parent recorded fleet's degree; the layers are whole
            count_shared_weights_once(self)  # deviation: fleet's marking of the tied weight's later copies fails

        def add_sequential_layer(self, layer_desc, name_prefix=""):
            # Deviation: every stage layer is built single-device, as the plain model under the family's TP plan
            # (paddle_vha.parallel shards it afterwards), not with fleet's mp layers at fleet's degree.
            kwargs = getattr(layer_desc, "kwargs", None)
            if isinstance(kwargs, dict) and "config" in kwargs:
                kwargs["config"] = self._single_device(kwargs["config"])
            parent.add_sequential_layer(self, layer_desc, name_prefix)

        def get_loss_fn(self, config):
            return parent.get_loss_fn(self, self._single_device(config))  # deviation: full logits, plain loss

        def _single_device(self, config):
            if self._stage_config is None:
                import copy

                stage = copy.deepcopy(config)
                stage.tensor_model_parallel_size, stage.tensor_parallel_output = 1, False
                object.__setattr__(self, "_stage_config", stage)
            return self._stage_config

        def sharded_state_dict(self, *args, **kwargs):
            sharded = parent.sharded_state_dict(self, *args, **kwargs)  # named as the plain model's tensors
            state = getattr(self, "_vha_tp_state", None)  # set by paddle_vha.parallel.parallelize_model
            if state is None or state.t == 1:
                return sharded
            single = self._pp_to_single_mapping  # the stage's own names -> the plain model's
            return declare_tp_shards(sharded, replace(state, shards={single[n]: s for n, s in state.shards.items()}))

    Pipe.__name__ = Pipe.__qualname__ = variant.prefix + "ForCausalLMPipe"
    Pipe.__module__ = variant.module
    return Pipe


def count_shared_weights_once(pipe) -> None:
    """Marks every stage's copy of a weight shared across stages (the tied embedding / LM head) but the first rank's
    with `is_firstly_shared = False`, so that fleet's hybrid gradient clipping counts it once in the global norm (the
    copies hold the same summed gradient). fleet's PipelineLayer means to do this, but it compares each parameter's
    name ("embedding_0.w_0") with the shared attribute's ("weight"), which never match (Paddle 3.3.1): with a tied
    head and gradient clipping, PP = 2 was 2.3e-4 off one process from step 2 (tests/test_pipeline_trainer.py)."""
    rank = getattr(pipe, "global_rank", None)
    for comm in (getattr(pipe, "shared_comm", None) or {}).values():
        for attr in comm["weight_attr"]:
            getattr(comm["layer"], attr).is_firstly_shared = rank == min(comm["ranks"])


def load_stage_weights(pipe, folder) -> None:
    """A checkpoint folder (the single-device contract), validated against the family's contract, into the
    parameters of this pipeline stage (paddle_vha.checkpoint.load: no PaddleFormers loader inside the ranks)."""
    from ..checkpoint.folder import CheckpointFolder
    from ..checkpoint.load import load_tensors_into

    ck = CheckpointFolder.open(folder)
    pipe.causal_lm_class.validate_checkpoint(ck)
    here = set(pipe.state_dict())
    tensors = ck.read_all(float32=True)
    if "lm_head.weight" in here and "lm_head.weight" not in tensors:  # tied: the last stage's copy of the embedding
        tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"]
    load_tensors_into(pipe, {n: t for n, t in tensors.items() if n in here}, source=ck.path)
