"""Weights one tensor-parallel rank holds under the plan, counted from the config alone (no model built).

    from paddle_vha.parallel.weights import rank_weight_count
    rank_weight_count(config, t=2, vocab_parallel=True)   # {"layers", "vocab", "other", "total", "single_device"}

docs/tensor_parallel.md ("Vocabulary parallelism") gives the counts at the 1.7B shape.
"""
from __future__ import annotations

import math

from ..families import family_of
from .apply import layer_plans

__all__ = ["rank_weight_count"]


def rank_weight_count(config, t: int, vocab_parallel: bool) -> dict:
    """Elements one rank of t holds under the plan, from the config alone (no model built): the decoder layers (each
    tensor split by its shard or whole), the embedding / LM head (split by vocabulary row or whole) and the rest
    (final norm). {"layers", "vocab", "other", "total", "single_device"}."""
    shapes = family_of(config).spec.tensor_shapes(config)
    plans = layer_plans(config, t, 0)
    out = {"layers": 0, "vocab": 0, "other": 0}
    for name, shape in shapes.items():
        n = math.prod(shape)
        if name.startswith("model.layers."):
            i, _, inner = name[len("model.layers."):].partition(".")
            rule = plans[int(i)].params.get(inner)
            out["layers"] += n // t if rule is not None and rule.axis is not None and t > 1 else n
        elif name in ("model.embed_tokens.weight", "lm_head.weight", "lm_head.bias"):
            out["vocab"] += n // t if vocab_parallel and t > 1 else n
        else:
            out["other"] += n
    out["total"] = out["layers"] + out["vocab"] + out["other"]
    out["single_device"] = sum(math.prod(s) for s in shapes.values())
    return out
