"""Stock Llama's causal LM as the llama family runs it: PaddleFormers' LlamaForCausalLM with one deviation."""
from __future__ import annotations

from paddleformers.transformers.llama.modeling import LlamaForCausalLM as _PaddleFormersLlamaForCausalLM

from ..modeling.checkpointing import drop_tied_head

__all__ = ["LlamaForCausalLM"]


class LlamaForCausalLM(_PaddleFormersLlamaForCausalLM):
    """PaddleFormers' Llama causal LM whose save leaves a tied LM head out (deviation: the parent writes lm_head.weight
    even when tied, which Hugging Face's layout and the llama family's spec do not have)."""

    @classmethod
    def _gen_inv_aoa_config(cls, config):
        return drop_tied_head(super()._gen_inv_aoa_config(config), config)
