"""Which form a layer's Postmix runs in, and whether its backward recomputes it (pure Python, no Paddle).

Postmix Y' = (I + V U^T) Y along the heads has two exact forms (paddle_vha/vha/attention.py):

* low-rank: Z = U^T Y (R x d per token), then Y + V Z: two GEMMs, 4·R·H_v·d FLOPs per token;
* dense (upstream PaddleFleet's): M = I + V U^T (H_v x H_v, once per call), then M Y: one GEMM, 2·H_v²·d FLOPs.

`vha_postmix_form` picks one: "lowrank", "dense", or "auto" (the default), which takes the form measured faster by
tools/bench_postmix.py (docs/results.md) for the call's shape: dense from DENSE_MIN_TOKENS tokens per call (B·S) up,
low-rank below (decode steps, short calls). Measured on CPU at the VHA article's 1.7B (H_v 16, R 4) and 30B-A3B
(H_v 48, R 12): dense is 1.9-2.3x faster forward and 1.2-2.2x forward + backward at 512 and 2048 tokens (and at R 1
to 24 at both head counts, 2048 tokens), low-rank 1.4-2x faster forward at 1-16 tokens; 128 tokens is near the
crossover (either way by run). Paddle runs either form as a batch of per-token matrix
products, and one product per token costs less than two even with 2x the FLOPs (H_v / 2R = 2 at both shapes) once
the batch is large; on a short call the dense form's extra M = I + V U^T build is what shows.

Under tensor parallelism the low-rank form always runs (an explicit "dense" is refused by the TP plan): each rank
holds H_v / t heads, and the low-rank form needs one all-reduce of Z, R·d values per token, where the dense form
would need every head's Y, an all-gather of H_v·d (4x the payload at both shapes, docs/tensor_parallel.md).

Selective recompute (upstream's names, PaddleFormers' config fields): `recompute_granularity: "selective"` with
"vha_postmix" in the list `recompute_modules` makes Postmix keep only its input for the backward and rerun itself
there (all layers, or the first `recompute_num_layers` with recompute_method "first_n" / "block", which without a
pipeline are the same layers).
"""
from __future__ import annotations

from typing import Optional

__all__ = ["FORMS", "DENSE_MIN_TOKENS", "resolve", "recomputes_postmix"]

FORMS = ("auto", "lowrank", "dense")
DENSE_MIN_TOKENS = 256  # "auto": dense from this many tokens per call (measured crossover: about 128 tokens)


def resolve(form: str, tokens: int, tensor_parallel: bool = False) -> str:
    """The form Postmix runs in for a call over `tokens` tokens (B·S): "lowrank" or "dense"."""
    if form not in FORMS:
        raise ValueError(f"vha_postmix_form must be one of {', '.join(FORMS)}, got {form!r}")
    if tensor_parallel:  # the R·d all-reduce is the only cross-rank exchange the plan has
        return "lowrank"
    if form != "auto":
        return form
    return "dense" if tokens >= DENSE_MIN_TOKENS else "lowrank"


def recomputes_postmix(config, layer_idx: int) -> bool:
    """Whether layer `layer_idx` recomputes its Postmix in the backward; ValueError (one line) for a setting upstream
    refuses or this project cannot honour."""
    modules = getattr(config, "recompute_modules", None)
    if isinstance(modules, dict) and "vha_postmix" in modules:
        raise ValueError("recompute_modules['vha_postmix']: only a list selects vha_postmix (as upstream)")
    if not (isinstance(modules, (list, tuple)) and "vha_postmix" in modules):
        return False
    granularity = getattr(config, "recompute_granularity", None)
    if granularity == "full":  # the whole decoder layer is recomputed (PaddleFormers), Postmix with it
        return False
    if granularity != "selective":
        raise ValueError(f"recompute_modules names vha_postmix but recompute_granularity is {granularity!r}: "
                         "selective recompute needs recompute_granularity 'selective'")
    n: Optional[int] = getattr(config, "recompute_num_layers", None)
    if n is None:
        return True
    method = getattr(config, "recompute_method", None)
    if method not in ("first_n", "block"):
        raise ValueError(f"recompute_num_layers={n} with vha_postmix needs recompute_method 'first_n' or 'block', "
                         f"got {method!r}")
    return layer_idx < n
