"""Read a stock Qwen3 (folded) checkpoint without touching its folder, and build Paddle models from it."""
from __future__ import annotations

from typing import Dict, Tuple

import numpy as np

from ..checkpoint import CheckpointError, compare_shapes, qwen3_tensor_shapes, read_config, read_tensor_shapes
from ..weights import load_tensors_into, read_checkpoint_tensors

__all__ = ["load_stock_qwen3", "reference_model"]


def load_stock_qwen3(ckpt_dir: str) -> Tuple[object, Dict[str, np.ndarray]]:
    """(config, {name: float32 array}) of a stock Qwen3 (or Qwen3-MEA) checkpoint, validated against the contract."""
    from paddleformers.transformers import Qwen3Config

    raw = read_config(ckpt_dir)
    if raw.get("model_type") == "qwen3_vha":
        raise CheckpointError(f"{ckpt_dir}: is a Qwen3-VHA checkpoint; fold it first (python tools/fold.py IN OUT)")
    if raw.get("model_type") == "qwen3_mea":
        return _load_mea(ckpt_dir)
    if raw.get("model_type") != "qwen3":
        raise CheckpointError(f"{ckpt_dir}: not a Qwen3 checkpoint (config.json model_type={raw.get('model_type')!r})")
    try:
        cfg = Qwen3Config.from_dict(raw)
    except (ValueError, TypeError) as e:
        raise CheckpointError(f"{ckpt_dir}/config.json: {e}") from None
    if cfg.num_attention_heads % cfg.num_key_value_heads:
        raise CheckpointError(f"{ckpt_dir}/config.json: num_attention_heads {cfg.num_attention_heads} is not a "
                              f"multiple of num_key_value_heads {cfg.num_key_value_heads}")
    compare_shapes(ckpt_dir, read_tensor_shapes(ckpt_dir), qwen3_tensor_shapes(cfg))
    return cfg, read_checkpoint_tensors(ckpt_dir)


def _load_mea(ckpt_dir: str):
    """Qwen3-MEA exports in the multi-query serving form, which needs k_norm on the cached physical heads."""
    from ..mea.checkpoint import validate_mea_checkpoint

    cfg = validate_mea_checkpoint(ckpt_dir)
    if cfg.mea_layer_indices and cfg.mea_k_norm_position != "before_hlc":
        raise CheckpointError(
            f"{ckpt_dir}: mea_k_norm_position={cfg.mea_k_norm_position!r}: the ONNX export uses the multi-query serving "
            "form, which needs 'before_hlc' (compress with tools/compress_kv.py --k-norm before)")
    return cfg, read_checkpoint_tensors(ckpt_dir)


def reference_model(cfg, tensors: Dict[str, np.ndarray]):
    """PaddleFormers' stock Qwen3ForCausalLM holding `tensors` (disk layout -> Paddle's [in, out] Linears)."""
    from paddleformers.transformers import Qwen3ForCausalLM

    if getattr(cfg, "model_type", "") == "qwen3_mea":
        from ..mea.modeling import Qwen3MEAForCausalLM

        model = Qwen3MEAForCausalLM(cfg)
    else:
        model = Qwen3ForCausalLM(cfg)
    load_tensors_into(model, tensors, source="reference model")
    model.eval()
    return model
