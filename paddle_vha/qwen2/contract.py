"""What a Qwen2 config.json must hold beyond Qwen3's checks (paddle_vha/qwen3/contract.py), refused in one line:
use_sliding_window false (Qwen2's sliding-window layers are not supported; Qwen2 and Qwen2.5 checkpoints leave it
false)."""
from __future__ import annotations

from ..qwen3.contract import check_config as check_qwen3_config
from ..qwen3.contract import check_config_fields as check_qwen3_fields

__all__ = ["check_config_fields", "check_config"]


def _check_qwen2(use_sliding_window) -> None:
    if use_sliding_window:
        raise ValueError("use_sliding_window=true: Qwen2's sliding-window layers are not supported (Qwen2 and Qwen2.5 "
                         "checkpoints set it false)")


def check_config_fields(fields: dict) -> None:
    """Qwen3's field checks, then Qwen2's, on config.json as written."""
    check_qwen3_fields(fields)
    _check_qwen2(fields.get("use_sliding_window"))


def check_config(cfg) -> None:
    """The same over a built config object."""
    check_qwen3_config(cfg)
    _check_qwen2(getattr(cfg, "use_sliding_window", None))
