"""What tools/lr_study.py measures on a loss curve: loss spikes and divergence, and the power-law fit of its tail.

Pure numpy on lists of numbers (no model, no Paddle), so both are tested against curves with known answers.
"""
from __future__ import annotations

import math

__all__ = ["UNIFORM_LOSS", "spike_report", "fit_power_law"]

UNIFORM_LOSS = math.log(256)  # next-byte cross-entropy of a model that predicts nothing (uniform over bytes)


def spike_report(losses, args):
    """(spiked, diverged, first event step or None) from the per-step training losses. Diverged: a NaN / Inf loss, or
    a run whose smoothed loss ends no better than the uniform predictor (collapsed: it unlearned everything)."""
    import numpy as np

    x = np.asarray(losses, float)
    if not np.isfinite(x).all():
        return False, True, int(np.argmax(~np.isfinite(x)))
    k = args.smooth
    sm = np.convolve(x, np.ones(k) / k, mode="valid") if len(x) >= k else x
    run_min = np.minimum.accumulate(sm)
    event = None
    for t in range(len(sm)):
        margin = max(args.spike_rel * run_min[t], args.spike_abs)
        if sm[t] > run_min[t] + margin:
            back = np.nonzero(sm[t:t + args.recover + 1] <= run_min[t] + margin / 2)[0]
            if len(back) == 0:
                event = t + k - 1
                break
    collapsed = bool(sm[-1] >= UNIFORM_LOSS - 0.01)
    return event is not None, collapsed, event


def fit_power_law(tokens, losses, alpha_range=(0.1, 2.0)):
    """L(t) = A t^-alpha + L_inf by least squares, with 0 <= L_inf <= min(L) and alpha in alpha_range (outside them the
    three terms are nearly collinear on a short curve and L_inf runs off to absurd values). For each alpha on a grid
    (then refined) A and L_inf are linear. Returns dict(A, alpha, L_inf, rms, L_inf_se, at_bound) or None when the
    curve has fewer than 4 finite points."""
    import numpy as np

    t = np.asarray(tokens, float)
    y = np.asarray(losses, float)
    ok = np.isfinite(y) & (t > 0)
    t, y = t[ok], y[ok]
    if len(t) < 4:
        return None
    hi_inf = float(y.min())

    def solve(alpha):
        x = t ** -alpha
        X = np.stack([x, np.ones_like(t)], axis=1)
        coef, *_ = np.linalg.lstsq(X, y, rcond=None)
        bound = None
        if not (0.0 <= coef[1] <= hi_inf):  # clamp L_inf, refit A alone
            linf = min(max(coef[1], 0.0), hi_inf)
            bound = "L_inf"
            a = float(x @ (y - linf) / (x @ x))
            coef = np.array([a, linf])
        r = y - X @ coef
        return float((r ** 2).sum()), coef, X, bound

    lo_a, hi_a = alpha_range
    grid = np.exp(np.linspace(np.log(lo_a), np.log(hi_a), 120))
    sse = [solve(a)[0] for a in grid]
    j = int(np.argmin(sse))
    lo, hi = grid[max(j - 1, 0)], grid[min(j + 1, len(grid) - 1)]
    for _ in range(50):  # golden-section refinement between the neighbours
        m1, m2 = lo + (hi - lo) * 0.382, lo + (hi - lo) * 0.618
        if solve(m1)[0] < solve(m2)[0]:
            hi = m2
        else:
            lo = m1
    alpha = 0.5 * (lo + hi)
    s, coef, X, bound = solve(alpha)
    if bound is None and (alpha <= lo_a * 1.01 or alpha >= hi_a * 0.99):
        bound = "alpha"
    sigma2 = s / max(len(t) - 3, 1)
    cov = sigma2 * np.linalg.pinv(X.T @ X)
    return dict(A=float(coef[0]), alpha=float(alpha), L_inf=float(coef[1]), rms=float(np.sqrt(s / len(t))),
                L_inf_se=float(np.sqrt(max(cov[1, 1], 0.0))), at_bound=bound)
