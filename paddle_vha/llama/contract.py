"""What a Llama config.json must hold beyond Qwen3's checks (paddle_vha/qwen3/contract.py), each refused in one line:

* tie_word_embeddings written out: PaddleFormers' LlamaConfig defaults it to true, Hugging Face's to false, so a
  config.json without it would be two different models;
* mlp_bias false: the MLP's tensors are declared without biases (Llama checkpoints have none);
* num_attention_heads x head_dim = hidden_size: PaddleFormers 1.0.0's LLamaAttention asserts it (Hugging Face's Llama
  does not; such a checkpoint, e.g. Mistral-Nemo's, is refused here rather than in an assertion).
"""
from __future__ import annotations

from ..qwen3.contract import check_config as check_qwen3_config
from ..qwen3.contract import check_config_fields as check_qwen3_fields

__all__ = ["check_config_fields", "check_config"]


def _check_llama(get, written: bool) -> None:
    if written and get("tie_word_embeddings") is None:
        raise ValueError("tie_word_embeddings is not set: PaddleFormers' Llama reads a missing value as true, Hugging "
                         "Face's as false; write it (true when there is no lm_head.weight)")
    if get("mlp_bias"):
        raise ValueError("mlp_bias=true: MLP biases are not supported (Llama checkpoints have none)")
    heads, d, h = get("num_attention_heads"), get("head_dim"), get("hidden_size")
    if all(isinstance(v, int) for v in (heads, d, h)) and heads * d != h:
        raise ValueError(f"num_attention_heads {heads} x head_dim {d} = {heads * d} differs from hidden_size {h}: "
                         "PaddleFormers' Llama attention requires them equal")


def check_config_fields(fields: dict) -> None:
    """Qwen3's field checks, then Llama's (module docstring), on config.json as written."""
    check_qwen3_fields(fields)
    _check_llama(fields.get, written=True)


def check_config(cfg) -> None:
    """The same over a built config object."""
    check_qwen3_config(cfg)
    _check_llama(lambda name: getattr(cfg, name, None), written=False)
