"""Qwen3-VHA in the cost model (paddle_vha/spec/cost.py): its formulas, its folded form, and the Arch fields of its
attention from config.json.

H_p = H_v / H_kv physical query heads of width r; Premix one r x d map per KV group; Postmix M = I + V U^T of rank R
(two small GEMMs, Z = U^T Y then V Z); an optional sigmoid gate (h -> H_v*d). Without Premix (kind "vha_nopremix"):
H_v query heads of width d from q_proj, Postmix only.
"""
from __future__ import annotations

from typing import Dict, Optional

from ..spec.cost import Arch, ArchError, AttentionCost
from .spec import projections_for

__all__ = ["VHA", "VHA_NO_PREMIX", "fold_vha", "arch_fields", "window_sizes", "DEFAULT_POSTMIX_RANK"]

DEFAULT_POSTMIX_RANK = 4  # Qwen3VHAConfig's default R (paddle_vha/vha/config.py reads it from here)


class VHACost(AttentionCost):
    kind = "vha"

    def validate(self, a: Arch) -> None:
        super().validate(a)
        if not (1 <= a.q_head_dim <= a.head_dim) or a.vha_postmix_rank < 1:
            raise ArchError(f"{a.label}: VHA needs 1 <= vha_q_head_dim <= head_dim and vha_postmix_rank >= 1")

    def physical_heads(self, a: Arch) -> int:
        return a.num_heads // a.num_kv_heads

    def weights(self, a: Arch) -> Dict[str, int]:
        parts = super().weights(a)
        parts["premix"] = a.num_kv_heads * a.q_head_dim * a.head_dim
        parts["postmix"] = 2 * a.num_heads * a.vha_postmix_rank
        if a.vha_gated:
            parts["gate_proj"] = a.hidden_size * a.num_heads * a.head_dim
        return parts

    def part_flops(self, a: Arch, name: str, n: int) -> float:
        if name == "premix":  # each of the H_p physical heads goes through each group's r x d map
            return 2 * self.physical_heads(a) * a.num_kv_heads * a.q_head_dim * a.head_dim
        if name == "postmix":  # Z = U^T Y (R x d) then V Z (H_v x d): two small GEMMs
            return 2 * 2 * a.num_heads * a.vha_postmix_rank * a.head_dim
        return super().part_flops(a, name, n)

    def named_fields(self, shape: dict) -> dict:
        return dict(vha_postmix_rank=shape["postmix_rank"])  # the paper's Postmix rank at that shape

    def with_shared_kv(self, a: Arch) -> Arch:
        return a.replace(kv_projections=projections_for(True))  # vha_shared_kv: the spec's one K = V projection

    def fold(self, a: Arch, label: Optional[str] = None) -> Arch:
        return fold_vha(a, label)

    def served_as(self, a: Arch, label: Optional[str] = None) -> Optional[Arch]:
        """The folded stock model; None for gated VHA (served as trained); ArchError when window layers have their own
        head counts or width (no stock form)."""
        return None if a.vha_gated else fold_vha(a, label)


VHA = VHACost()


class VHANoPremixCost(VHACost):
    """VHA without Premix (vha_premix=false, the research fork's kv_postmix_only): q_proj emits the H_v heads of width
    d as stock GQA does; only Postmix is added."""

    kind = "vha_nopremix"

    def validate(self, a: Arch) -> None:
        super().validate(a)
        if a.q_head_dim != a.head_dim:
            raise ArchError(f"{a.label}: VHA without Premix has query heads of width head_dim (vha_q_head_dim unset)")

    def physical_heads(self, a: Arch) -> int:
        return a.num_heads

    def weights(self, a: Arch) -> Dict[str, int]:
        parts = super().weights(a)
        del parts["premix"]
        return parts


VHA_NO_PREMIX = VHANoPremixCost()


def fold_vha(arch: Arch, label: Optional[str] = None) -> Arch:
    """The stock GQA model a VHA model is served as: H_v query heads of width d, same KV heads, no Premix/Postmix."""
    if not isinstance(arch.cost, VHACost):
        raise ArchError(f"{arch.label}: only a VHA model folds (kind {arch.kind!r})")
    if arch.vha_gated:
        raise ArchError(f"{arch.label}: gated VHA does not fold exactly (the gate sits between Postmix and o_proj)")
    own = [k for k, _ in arch.window_sizes if k in ("num_heads", "num_kv_heads", "head_dim")]
    if own:
        raise ArchError(f"{arch.label}: its sliding-window layers have their own {own[0]}; stock Qwen3 has one set of "
                        "sizes, so it does not fold")
    return arch.replace(kind="vha_folded", vha_q_head_dim=None, vha_postmix_rank=0, window_sizes=(),
                        label=label or f"{arch.label} (folded)")


def arch_fields(cfg: dict, common: dict) -> dict:
    """H_p = H_v / H_kv physical query heads of width r, Premix per group, Postmix of rank R, optional gate."""
    return dict(kind="vha" if cfg.get("vha_premix", True) else "vha_nopremix", num_kv_heads=cfg.get("num_key_value_heads") or common["num_heads"],
                vha_q_head_dim=cfg.get("vha_q_head_dim") or common["head_dim"],
                vha_postmix_rank=cfg.get("vha_postmix_rank", DEFAULT_POSTMIX_RANK), vha_gated=bool(cfg.get("vha_gated_attention", False)),
                kv_projections=projections_for(bool(cfg.get("vha_shared_kv", False))), window_sizes=window_sizes(cfg))


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
