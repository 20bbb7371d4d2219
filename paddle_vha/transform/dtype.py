"""The one --dtype option of the checkpoint transforms: its choices and what a choice means for the output."""
from __future__ import annotations

from typing import Mapping

from ..checkpoint import safetensors_io as st

__all__ = ["DTYPE_CHOICES", "check_dtype", "output_code"]

DTYPE_CHOICES = ("auto", "float32", "float64", "bfloat16", "float16")


def check_dtype(dtype: str, error) -> None:
    """`error` (one line) unless `dtype` is one of DTYPE_CHOICES."""
    if dtype not in DTYPE_CHOICES:
        raise error(f"--dtype {dtype!r}: expected one of {', '.join(DTYPE_CHOICES)}")


def output_code(dtype: str, inputs: Mapping[str, st.TensorRef], like: str = "model.embed_tokens.weight") -> str:
    """The safetensors dtype code of the output: the named choice, or for "auto" the dtype of input tensor `like`."""
    return inputs[like].dtype if dtype == "auto" else st.dtype_code(dtype)
