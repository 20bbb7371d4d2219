"""Opening a stock Qwen3 checkpoint as the input of a converter (tools/compress_kv.py, tools/convert_to_vha.py)."""
from __future__ import annotations

from ..checkpoint.folder import CheckpointFolder
from ..families import family

__all__ = ["open_stock_qwen3"]


def open_stock_qwen3(src, error, hint: str = ""):
    """(CheckpointFolder, its Qwen3Config) for a stock Qwen3 checkpoint (path or opened folder), checked from the config
    and the safetensors headers alone. Anything else raises `error` with one line (`hint` is appended to the wrong-type
    message)."""
    ck = CheckpointFolder.open(src)
    stock = family("qwen3")
    if ck.model_type != stock.model_type:
        raise error(f"{ck.path}: not a stock Qwen3 checkpoint (config.json model_type={ck.model_type!r}, "
                    f"expected {stock.model_type!r}){hint}")
    cfg = stock.load_config(ck)
    if cfg.fuse_attention_qkv:
        raise error(f"{ck.path}/config.json: fuse_attention_qkv=true checkpoints are not supported")
    stock.check_tensors(ck, cfg)
    return ck, cfg
