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
    mean_kl = mean over positions of KL(softmax(a) || softmax(b)) in nats."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    diff = np.abs(a - b)
    la, lb = log_softmax(a), log_softmax(b)
    kl = (np.exp(la) * (la - lb)).sum(-1)
    return {"max_abs": float(diff.max()), "max_rel": float(diff.max() / max(np.abs(a).max(), 1e-30)),
            "mean_kl": float(kl.mean())}
