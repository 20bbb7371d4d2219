"""Opening a stock Qwen3 checkpoint as the input of a converter (tools/compress_kv.py, tools/convert_to_vha.py)."""
from __future__ import annotations

from ..checkpoint.contract import compare_shapes
from ..checkpoint.folder import CheckpointFolder
from ..spec.validate import load_config
from .base import QWEN3_BASE

__all__ = ["open_stock_qwen3"]


def open_stock_qwen3(src, error, hint: str = ""):
    """(CheckpointFolder, its Qwen3Config) for a stock Qwen3 checkpoint (path or opened folder), checked from the config
    and the safetensors headers alone. Anything else raises `error` with one line (`hint` is appended to the wrong-type
    message)."""
    from paddleformers.transformers import Qwen3Config

    ck = CheckpointFolder.open(src)
    if ck.model_type != "qwen3":
        raise error(f"{ck.path}: not a stock Qwen3 checkpoint (config.json model_type={ck.model_type!r}, "
                    f"expected 'qwen3'){hint}")
    cfg = load_config(ck, "qwen3", QWEN3_BASE.name, Qwen3Config, QWEN3_BASE)
    if cfg.fuse_attention_qkv:
        raise error(f"{ck.path}/config.json: fuse_attention_qkv=true checkpoints are not supported")
    compare_shapes(ck.path, ck.shapes, QWEN3_BASE.spec.tensor_shapes(cfg))
    return ck, cfg
