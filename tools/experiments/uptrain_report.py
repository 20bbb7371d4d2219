"""What tools/experiments/uptrain_study.py reports from its runs: the per-arm statistics over seeds, the final-loss
table, the crossover (tokens to within 2% of the base's validation loss), the curve table, the plot and the sentence.

An arm is a start and its uptraining loss: "VHA svd (KD)" is VHA svd uptrained with the distillation mix against the
base, "VHA svd (CE)" the same start with plain cross-entropy; a from-scratch reference is trained with CE only.
"""
from __future__ import annotations

import math

__all__ = ["arm", "arms_in", "summarize", "crossover", "table", "crossover_table", "curve_table", "sentence", "plot"]

WITHIN = 0.02  # the crossover's target: validation loss <= (1 + WITHIN) x the base's


def arm(run) -> str:
    return run["start"] if run["reference"] else f"{run['start']} ({run['loss'].upper()})"


def arms_in(runs) -> list:
    seen = []
    for r in runs:
        if arm(r) not in seen:
            seen.append(arm(r))
    return seen


def mean_std(xs):
    import numpy as np

    xs = np.asarray(xs, float)
    return float(xs.mean()), (float(xs.std(ddof=1)) if len(xs) > 1 else float("nan"))


def points(run, tokens_per_step):
    """[(tokens, val loss)] of one run: step 0 (a start's value before uptraining) and each evaluation."""
    pts = [] if run["reference"] else [(0, run["val0"])]
    return pts + [(s * tokens_per_step, v) for s, v in run["curve"]]


def tokens_to_reach(pts, target):
    """The first token count at which the curve is at or below target, linearly interpolated between the two
    evaluations around the crossing; None if it never gets there."""
    prev = None
    for t, v in pts:
        if v is not None and v == v and v <= target:
            if prev is None or prev[1] <= target:
                return float(t)
            (t0, v0) = prev
            return float(t0 + (t - t0) * (v0 - target) / (v0 - v))
        prev = (t, v)
    return None


def crossover(runs, base_val, tokens_per_step) -> dict:
    """Per arm: the per-seed tokens to reach (1 + WITHIN) x base_val (None: not reached) and the run's length."""
    out = {}
    for a in arms_in(runs):
        rs = [r for r in runs if arm(r) == a]
        out[a] = dict(per_seed=[tokens_to_reach(points(r, tokens_per_step), (1 + WITHIN) * base_val) for r in rs],
                      length=max(r["steps"] for r in rs) * tokens_per_step)
    return out


def summarize(runs) -> dict:
    out = {}
    for a in arms_in(runs):
        rs = [r for r in runs if arm(r) == a]
        out[a] = {k: mean_std([r[k] for r in rs]) for k in ("val0", "kl0", "val", "kl")}
        out[a]["per_seed_val"] = [r["val"] for r in rs]
    return out


def _pm(ms, p=4):
    m, sd = ms
    return f"{m:.{p}f} ± {sd:.{p}f}" if sd == sd else f"{m:.{p}f}"


def table(stats, references) -> str:
    rows = ["| arm | val loss step 0 | KL step 0 | val loss after | KL after |", "| --- | ---: | ---: | ---: | ---: |"]
    for a, s in stats.items():
        if a in references:
            rows.append(f"| {a} (from scratch) | — | — | {_pm(s['val'])} | {_pm(s['kl'])} |")
        else:
            rows.append(f"| {a} | {_pm(s['val0'])} | {_pm(s['kl0'])} | {_pm(s['val'])} | {_pm(s['kl'])} |")
    return "\n".join(rows)


def crossover_table(cross, base_tokens) -> str:
    rows = [f"| arm | tokens to within {WITHIN:.0%} of the base's loss | seeds reaching it | as % of the base's "
            f"{base_tokens:,} tokens |", "| --- | ---: | ---: | ---: |"]
    for a, c in cross.items():
        hit = [t for t in c["per_seed"] if t is not None]
        n = len(c["per_seed"])
        if not hit:
            rows.append(f"| {a} | not reached within {c['length']:,} | 0 / {n} | — |")
            continue
        m, sd = mean_std(hit)
        rows.append(f"| {a} | {m:,.0f}{f' ± {sd:,.0f}' if sd == sd else ''} | {len(hit)} / {n} | "
                    f"{100 * m / base_tokens:.1f}% |")
    return "\n".join(rows)


def curve_table(runs, tokens_per_step) -> str:
    """Mean validation loss over seeds at each evaluated token count, one row per arm."""
    lines = ["| arm | tokens: validation loss (mean over seeds) |", "| --- | --- |"]
    for a in arms_in(runs):
        rs = [r for r in runs if arm(r) == a]
        per = [points(r, tokens_per_step) for r in rs]
        cells = [f"{t:,}: {mean_std([p[i][1] for p in per])[0]:.4f}" for i, (t, _) in enumerate(per[0])]
        lines.append(f"| {a} | {'; '.join(cells)} |")
    return "\n".join(lines)


def sentence(stats, references, base_val, n_seeds) -> str:
    starts = [a for a in stats if a not in references]
    if not starts:
        return ""
    ranked = sorted(starts, key=lambda a: stats[a]["val"][0])
    best, worst = ranked[0], ranked[-1]
    m, sd = stats[best]["val"]
    text = (f"After equal uptraining, {best} recovers most: validation loss {_pm((m, sd))} (over {n_seeds} seeds) "
            f"against the GQA-8 base's {base_val:.4f}")
    if len(ranked) > 1:
        m2, sd2 = stats[ranked[1]]["val"]
        se = math.sqrt((sd ** 2 + sd2 ** 2) / n_seeds) if n_seeds > 1 else float("nan")
        where = "beyond" if se == se and m2 - m > 2 * se else "within"
        text += (f"; the runner-up, {ranked[1]}, is {m2 - m:.4f} behind ({where} twice the standard error of the "
                 f"difference, {se:.4f})")
    text += f"; {worst} recovers least ({_pm(stats[worst]['val'])})."
    refs = [a for a in references if a in stats]
    if refs:
        text += " Trained from scratch: " + ", ".join(f"{a} {_pm(stats[a]['val'])}" for a in refs) + "."
    return text


def plot(runs, base_val, tokens_per_step, path, title):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, ax = plt.subplots(figsize=(8, 5))
    starts = list(dict.fromkeys(r["start"] for r in runs))  # one colour per start: its CE and KD arms share it
    colour = {n: plt.get_cmap("tab10")(i % 10) for i, n in enumerate(starts)}
    for a in arms_in(runs):
        rs = [r for r in runs if arm(r) == a]
        per = [points(r, tokens_per_step) for r in rs]
        x = np.array([t for t, _ in per[0]], float)
        vals = np.array([[v for _, v in p] for p in per], float)
        m, sd = vals.mean(0), vals.std(0)
        style = dict(ls=":" if rs[0]["reference"] else ("-" if rs[0]["loss"] == "kd" else "--"), lw=1.5, marker="o",  # KD solid, CE dashed
                     ms=2.5, color=colour[rs[0]["start"]])
        ax.plot(x, m, label=a + (" (training tokens)" if rs[0]["reference"] else ""), **style)
        ax.fill_between(x, m - sd, m + sd, alpha=0.12)
    ax.axhline(base_val, color="k", ls="--", lw=1, label="GQA-8 base")
    ax.axhline((1 + WITHIN) * base_val, color="gray", ls="-.", lw=0.8, label=f"base + {WITHIN:.0%}")
    ax.set_yscale("log")
    ax.set_xlabel("uptraining tokens (converted starts) / training tokens (from scratch), bytes")
    ax.set_ylabel("validation loss (nats / byte, log scale)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=6, ncol=2)
    ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
