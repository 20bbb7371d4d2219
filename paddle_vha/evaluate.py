"""How far apart two models' logits are: the one comparison fold --verify, compress_kv and the tests report."""
from __future__ import annotations

from typing import Dict

import numpy as np

__all__ = ["log_softmax", "compare_logits"]


def log_softmax(z: np.ndarray) -> np.ndarray:
    """Over the last axis, in the input's float precision (float64 for the comparisons here)."""
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def compare_logits(a: np.ndarray, b: np.ndarray) -> Dict[str, float]:
    """Reference logits `a` vs `b` (same shape, vocabulary last): max_abs, max_rel = max |a - b| / max |a|, and
    mean_kl = mean over positions of KL(softmax(a) || softmax(b)) in nats. `nonfinite` names which side holds a NaN or
    Inf ("" when both are finite): then the numbers mean nothing, and every caller treats it as a failure."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    nonfinite = " and ".join(w for w, x in (("reference", a), ("compared", b)) if not np.isfinite(x).all())
    if nonfinite:
        nan = float("nan")
        return {"max_abs": nan, "max_rel": nan, "mean_kl": nan, "nonfinite": nonfinite}
    diff = np.abs(a - b)
    la, lb = log_softmax(a), log_softmax(b)
    kl = (np.exp(la) * (la - lb)).sum(-1)
    return {"max_abs": float(diff.max()), "max_rel": float(diff.max() / max(np.abs(a).max(), 1e-30)),
            "mean_kl": float(kl.mean()), "nonfinite": ""}
