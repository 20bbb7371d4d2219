"""The one plan printer: a plan describes itself as data (a Description), `format_plan` lays it out.

    fold IN -> OUT                                          title
      Qwen3-VHA: 2 layers, ...                              header lines
      tensors (name pattern, count, in -> out):             table caption
        model.layers.{i}.self_attn.q_proj.weight  x2  ...  table rows (leading cells padded to the table's widths)
      bytes: ...                                            footer lines
      note: ...                                             notes
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable, Dict, Hashable, Iterable, List, Optional, Sequence, Tuple

from ..units import fmt_bytes

__all__ = ["Description", "Table", "format_plan", "layer_pattern", "group", "files_line", "skipped_lines",
           "kv_cache_line", "output_line"]


@dataclass
class Table:
    """Rows of cells; cell k < len(widths) is padded to widths[k], the last cells are written as they are."""

    caption: str
    widths: Tuple[int, ...]
    rows: List[Tuple[str, ...]] = field(default_factory=list)


@dataclass
class Description:
    title: str
    header: List[str] = field(default_factory=list)
    table: Optional[Table] = None
    footer: List[str] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)


def _row(cells: Sequence[str], widths: Sequence[int]) -> str:
    return " ".join(c.ljust(widths[k]) if k < len(widths) else c for k, c in enumerate(cells))


def format_plan(plan) -> str:
    """What tools print before writing (and all that --dry-run does): plan.describe(), laid out."""
    d = plan.describe()
    lines = [d.title] + [f"  {h}" for h in d.header]
    if d.table is not None:
        lines.append(f"  {d.table.caption}")
        lines += [f"    {_row(r, d.table.widths)}" for r in d.table.rows]
    return "\n".join(lines + [f"  {f}" for f in d.footer] + [f"  note: {n}" for n in d.notes])


def layer_pattern(name: str) -> str:
    """model.layers.3.mlp.up_proj.weight -> model.layers.{i}.mlp.up_proj.weight (one table row for all layers; a MoE
    layer's experts.7. -> experts.{e}., one row for all experts)."""
    return re.sub(r"experts\.\d+\.", "experts.{e}.", re.sub(r"layers\.\d+\.", "layers.{i}.", name))


def group(items: Iterable, key: Callable[[object], Hashable]) -> Dict[Hashable, list]:
    """Items by key, keys in first-seen order (a table row per key)."""
    out: Dict[Hashable, list] = {}
    for x in items:
        out.setdefault(key(x), []).append(x)
    return out


def files_line(plan) -> str:
    return f"files copied: {', '.join(plan.copy_files) if plan.copy_files else '(none)'}"


def skipped_lines(plan) -> List[str]:
    return [f"not copied (folders): {', '.join(plan.skipped)}"] if plan.skipped else []


def kv_cache_line(plan) -> str:
    """KV cache bytes per token of a plan's input and of its output, all layers, at the output dtype (the transforms
    that change the attention: convert_to_vha, compress_kv)."""
    from ..accounting import arch_from_config, kv_bytes_per_token
    from ..checkpoint import safetensors_io as st

    elem = st.DTYPES[plan.out_code].itemsize
    before = kv_bytes_per_token(arch_from_config(plan.in_config), elem, all_layers=True)
    after = kv_bytes_per_token(arch_from_config(plan.out_config), elem, all_layers=True)
    return (f"KV cache per token ({st.dtype_name(plan.out_code)}): {fmt_bytes(before, fixed=True)} -> "
            f"{fmt_bytes(after, fixed=True)} ({after / before:.1%})")


def output_line(plan) -> str:
    return (f"output: {len(plan.entries)} tensors, {fmt_bytes(plan.bytes_out, fixed=True)}; copied files: "
            f"{', '.join(plan.copy_files) or 'none'}")
