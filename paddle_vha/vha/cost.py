"""Qwen3-VHA in the cost model (paddle_vha/accounting.py): the Arch fields of its attention, from config.json."""
from __future__ import annotations

__all__ = ["arch_fields", "window_sizes"]


def arch_fields(cfg: dict, common: dict) -> dict:
    """H_p = H_v / H_kv physical query heads of width r, Premix per group, Postmix of rank R, optional gate."""
    return dict(kind="vha", num_kv_heads=cfg.get("num_key_value_heads") or common["num_heads"],
                vha_q_head_dim=cfg.get("vha_q_head_dim") or common["head_dim"],
                vha_postmix_rank=cfg.get("vha_postmix_rank", 4), vha_gated=bool(cfg.get("vha_gated_attention", False)),
                shared_kv=bool(cfg.get("vha_shared_kv", False)), window_sizes=window_sizes(cfg))


_WINDOW_SIZES = (("vha_window_num_attention_heads", "num_heads"), ("vha_window_num_key_value_heads", "num_kv_heads"),
                 ("vha_window_head_dim", "head_dim"), ("vha_window_q_head_dim", "vha_q_head_dim"),
                 ("vha_window_postmix_rank", "vha_postmix_rank"))


def window_sizes(cfg: dict) -> tuple:
    """(Arch field, value) pairs in which the sliding-window layers differ (the vha_window_* options that are set; a
    new head width makes r = d_w unless vha_window_q_head_dim says otherwise, as the model builds it)."""
    out = {field: cfg[key] for key, field in _WINDOW_SIZES if cfg.get(key) is not None}
    if out.get("head_dim", cfg.get("head_dim")) != cfg.get("head_dim") and "vha_q_head_dim" not in out:
        out["vha_q_head_dim"] = out["head_dim"]
    return tuple(sorted(out.items()))
