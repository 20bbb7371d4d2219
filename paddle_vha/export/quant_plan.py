"""Which weights a quantized export stores in how many bits, by what they are in the model.

A weight's role comes from the checkpoint tensor it holds (export_info.json's `weight_sources`, recorded by the
decoder as it is built): `embed`, `lm_head`, or a layer's `q_proj`, `k_proj`, `v_proj`, `o_proj`, `gate_proj`,
`up_proj`, `down_proj` (with its layer index). A mixed-precision rule names the roles that get 8 bits in a 4-bit
export, each optionally limited to layers:

    v_proj            every layer's v_proj
    down_proj@0-3     layers 0..3
    down_proj@-4-     the last four layers (negative indices count from the end)
    lm_head           the LM head (tied: the shared embedding table too)

Which roles, and how many bits: from the per-tensor sensitivity table measured on a real model
(tools/quant_sensitivity.py, docs/deploy.md "Where the bits go"); MIXED_DEFAULT holds the rule that table chose.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Dict, Iterable, Optional, Tuple

__all__ = ["ROLES", "role_of", "parse_rule", "bits_for", "MIXED_DEFAULT", "RuleError", "Role"]

ROLES = ("embed", "lm_head", "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_LAYER = re.compile(r"^model\.layers\.(\d+)\.(?:self_attn|mlp)\.(\w+_proj)\.weight$")
# the rule a 4-bit export follows by default: chosen from the measured sensitivity table (docs/deploy.md)
MIXED_DEFAULT = ("v_proj", "down_proj", "up_proj@-2-", "lm_head")


class RuleError(ValueError):
    """A mixed-precision rule that cannot be read (one line)."""


@dataclass(frozen=True)
class Role:
    name: str  # one of ROLES
    layer: Optional[int] = None  # for the layers' projections


def role_of(source: Optional[str]) -> Optional[Role]:
    """The role of the checkpoint tensor `source` (None when it is not a quantizable weight)."""
    if source is None:
        return None
    if source == "model.embed_tokens.weight":
        return Role("embed")
    if source.startswith("lm_head.weight"):
        return Role("lm_head")
    m = _LAYER.match(source)
    if m and m.group(2) in ROLES:
        return Role(m.group(2), int(m.group(1)))
    return None


def parse_rule(rule: Iterable[str]) -> Tuple[Tuple[str, Optional[Tuple[int, Optional[int]]]], ...]:
    """((role, (first, last) or None), ...) from items like "v_proj", "down_proj@0-3", "down_proj@-4-";
    RuleError naming the item that cannot be read."""
    out = []
    for item in rule:
        item = item.strip()
        if not item:
            continue
        name, _, layers = item.partition("@")
        if name not in ROLES:
            raise RuleError(f"mixed-precision rule {item!r}: unknown role {name!r} (one of {', '.join(ROLES)})")
        span = None
        if layers:
            m = re.fullmatch(r"(-?\d+)(?:-(-?\d*))?", layers)
            if not m or name in ("embed", "lm_head"):
                raise RuleError(f"mixed-precision rule {item!r}: layers must read FIRST-LAST, FIRST- or N (a "
                                "layer's projections only)")
            first = int(m.group(1))
            last = first if m.group(2) is None else (int(m.group(2)) if m.group(2) not in ("", None) else None)
            span = (first, last)
        out.append((name, span))
    return tuple(out)


def _in_span(layer: int, span, num_layers: int) -> bool:
    first, last = span
    first = first + num_layers if first < 0 else first
    last = num_layers - 1 if last is None else (last + num_layers if last < 0 else last)
    return first <= layer <= last


def bits_for(sources: Dict[str, str], base_bits: int, rule, num_layers: int) -> Dict[str, int]:
    """{initializer name: bits} for every weight of `sources` with a role: 8 where `rule` (parse_rule's) names it in a
    4-bit export, else `base_bits`. The embedding follows the LM head when they share a table (the caller's
    concern); here it follows its own role."""
    out = {}
    for name, source in sources.items():
        role = role_of(source)
        if role is None:
            continue
        bits = base_bits
        if base_bits == 4:
            for r, span in rule:
                if r == role.name and (span is None or (role.layer is not None and _in_span(role.layer, span,
                                                                                            num_layers))):
                    bits = 8
        out[name] = bits
    return out
