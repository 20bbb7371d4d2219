"""Which layers of a Qwen3-MEA model use MEA: the one reader of `mea_layers` (config, plans, cost model, compress_kv).

Pure Python, no Paddle, so the tensor-parallel plan and the calculators use it too.
"""
from __future__ import annotations

from typing import List, Optional, Sequence

__all__ = ["MEAConfigError", "parse_layer_spec", "is_mea_layer", "count_mea_layers"]


class MEAConfigError(ValueError):
    """A Qwen3-MEA configuration that cannot describe a valid model."""


def parse_layer_spec(spec: str, num_layers: int, deep_skip: int = 3) -> List[int]:
    """'all' | 'deep' | 'A-B' (inclusive) | 'i,j,k' -> sorted layer indices; MEAConfigError if malformed.

    'deep' is the paper's deep-layer setting: every layer but the first `deep_skip` (3 in the paper).
    """
    spec = str(spec).strip()
    if spec == "all":
        return list(range(num_layers))
    if spec == "deep":
        if num_layers <= deep_skip:
            raise MEAConfigError(f"--layers deep keeps the first {deep_skip} layers stock, but the model has only {num_layers}")
        return list(range(deep_skip, num_layers))
    try:
        if "-" in spec:
            a, b = (int(t) for t in spec.split("-"))
            layers = list(range(a, b + 1))
        else:
            layers = sorted({int(t) for t in spec.split(",")})
    except ValueError:
        raise MEAConfigError(f"layer spec {spec!r} must be 'all', 'deep', 'A-B' or a comma list of layer indices") from None
    if not layers or layers[0] < 0 or layers[-1] >= num_layers:
        raise MEAConfigError(f"layer spec {spec!r} selects layers outside 0..{num_layers - 1} (or none)")
    return layers


def is_mea_layer(mea_layers: Optional[Sequence[int]], layer_idx: int) -> bool:
    """mea_layers None means every layer."""
    return mea_layers is None or layer_idx in mea_layers


def count_mea_layers(mea_layers, num_layers: int) -> int:
    """How many layers use MEA, from a config's mea_layers: None (all), a list, or a layer spec string."""
    if mea_layers is None:
        return num_layers
    if isinstance(mea_layers, str):
        return len(parse_layer_spec(mea_layers, num_layers))
    if isinstance(mea_layers, (list, tuple)):
        return len(set(mea_layers))
    raise MEAConfigError(f"cannot read mea_layers={mea_layers!r}")
