"""Opening a stock checkpoint (Qwen3, Llama, Qwen2: any dense base with a Paddle model) as the input of a converter
(tools/convert_to_vha.py, tools/compress_kv.py), and the family the converter writes (the variant over its base)."""
from __future__ import annotations

from dataclasses import dataclass

from ..checkpoint.contract import CheckpointError, compare_shapes
from ..checkpoint.folder import CheckpointFolder
from ..families import Family, UnknownFamily, convertible, family_of, variant_over

__all__ = ["StockSource", "open_stock"]


@dataclass(frozen=True)
class StockSource:
    folder: CheckpointFolder
    config: object  # the stock family's typed config
    family: Family  # the stock family (qwen3, llama, qwen2)
    target: Family  # the variant over its base the converter writes (qwen3_vha, llama_vha, ...)


def open_stock(src, error, variant: str, hint: str = "") -> StockSource:
    """The stock checkpoint `src` (a path or an opened folder) and its converted family, checked from config.json and
    the safetensors headers alone. Anything else raises `error` with one line (`hint` is appended to the wrong-type
    message)."""
    ck = CheckpointFolder.open(src)
    stock = ", ".join(repr(f.model_type) for f in convertible(variant))
    try:
        fam = family_of(ck)
    except UnknownFamily:
        fam = None
    target = variant_over(fam.base, variant) if fam is not None and fam.stock and fam.has_model else None
    if target is None:
        raise error(f"{ck.path}: not a stock checkpoint this converts (config.json model_type={ck.model_type!r}, "
                    f"expected one of {stock}){hint}")
    try:
        cfg = fam.load_config(ck)
    except CheckpointError as e:
        raise error(str(e)) from None
    if getattr(cfg, "fuse_attention_qkv", False):
        raise error(f"{ck.path}/config.json: fuse_attention_qkv=true checkpoints are not supported")
    compare_shapes(ck.path, ck.shapes, fam.tensor_shapes(cfg))
    return StockSource(ck, cfg, fam, target)
