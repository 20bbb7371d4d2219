"""The generate loop's sampling against its definition (paddle_vha/serve/generate.py).

Temperature, top-k and top-p as Hugging Face transformers define them (temperature divides the logits; top-k keeps
the k largest; top-p keeps the smallest most-probable set whose mass reaches p, renormalized), computed here in float64
from the logits alone, is the reference distribution. The loop runs over a session that returns fixed logits every
step, so each row of each step is one draw: 12,000 draws per logit row and case over 6 seeds, each frequency within
5 standard errors of its reference probability (plus 1e-3), and no draw ever outside the kept set. A filter that
does nothing (top-p's keep rule `< 2.0`, top-k skipped, temperature ignored) moves some token by tens of standard
errors. EOS: each row of a batch stops at its own first EOS, the loop stops when all have.
"""
from __future__ import annotations

import numpy as np
import pytest

from paddle_vha.serve.generate import generate

V = 12
LOGITS = np.array([[2.0, 1.6, 1.3, 1.1, 0.9, 0.4, 0.2, 0.0, -0.3, -0.8, -1.2, -2.0],
                   [-1.0, 0.3, 2.4, -0.5, 1.9, 0.0, 1.0, -2.0, 0.6, 1.5, -0.2, 0.8]])  # two different rows


class FixedLogits:
    """A decoder session (prefill / step) whose next-token logits are `rows` at every position: B = rows x copies."""

    def __init__(self, rows: np.ndarray, copies: int):
        self.logits = np.repeat(rows, copies, axis=0).astype(np.float32)  # (B, V), row r at [r*copies:(r+1)*copies]
        self.steps = 0

    def prefill(self, ids, mask):
        return self.logits[:, None, :], None  # (B, 1, V)

    def step(self, ids, cache, mask):
        self.steps += 1
        return self.logits[:, None, :], None


def reference(logits: np.ndarray, temperature: float, top_k: int, top_p: float) -> np.ndarray:
    """The sampling distribution of one row, in float64, from the definitions (sorted most probable first)."""
    z = logits.astype(np.float32).astype(np.float64) / temperature
    order = sorted(range(len(z)), key=lambda i: -z[i])
    kept = order[:top_k] if top_k else order
    p = np.exp(z[kept] - z[kept].max())
    p /= p.sum()
    nucleus, mass = [], 0.0
    for i, q in zip(kept, p):
        if mass >= top_p:
            break
        nucleus.append(i)
        mass += q
    out = np.zeros(len(z))
    out[nucleus] = np.exp(z[nucleus] - z[nucleus].max())
    return out / out.sum()


def draws(temperature, top_k, top_p, copies=250, steps=8, seeds=range(6)):
    """Counts (rows, V) of the tokens the loop samples over `seeds`: copies x steps x seeds draws per row."""
    counts = np.zeros((len(LOGITS), V))
    for seed in seeds:
        res = generate(FixedLogits(LOGITS, copies), np.zeros((len(LOGITS) * copies, 1), np.int64), steps,
                       do_sample=True, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)
        for r in range(len(LOGITS)):
            counts[r] += np.bincount(res.tokens[r * copies:(r + 1) * copies].ravel(), minlength=V)
    return counts


@pytest.mark.parametrize("temperature, top_k, top_p", [
    (1.0, 0, 1.0), (0.6, 0, 1.0), (1.7, 0, 1.0),  # temperature alone
    (1.0, 4, 1.0), (1.3, 7, 1.0),  # top-k
    (1.0, 0, 0.7), (0.8, 0, 0.5), (1.5, 0, 0.9),  # top-p
    (1.2, 6, 0.8), (0.7, 3, 0.95),  # both, after temperature
])
def test_sampling_matches_its_definition(temperature, top_k, top_p):
    counts = draws(temperature, top_k, top_p)
    n = counts.sum(-1, keepdims=True)
    want = np.stack([reference(row, temperature, top_k, top_p) for row in LOGITS])
    freq = counts / n
    se = np.sqrt(want * (1 - want) / n)
    z = np.abs(freq - want) / np.maximum(se, 1e-12)
    print(f"T={temperature} k={top_k} p={top_p}: {int(n[0, 0])} draws/row, max |freq - p| "
          f"{np.abs(freq - want).max():.4f}, max z {z[want > 0].max():.2f}, draws outside the kept set "
          f"{int(counts[want == 0].sum())}")
    assert counts[want == 0].sum() == 0, "a token outside top-k / top-p was sampled"
    assert (np.abs(freq - want) <= 5 * se + 1e-3).all(), (freq, want)


def test_the_bound_catches_a_disabled_filter():
    """The reference of a case with its filter off differs from the filtered one by far more than the bound: the test
    above fails for a loop that skips the filter (checked by breaking it by hand: `< 2.0`, top-k removed)."""
    for on, off in (((1.0, 0, 0.7), (1.0, 0, 1.0)), ((1.0, 4, 1.0), (1.0, 0, 1.0)), ((0.6, 0, 1.0), (1.0, 0, 1.0))):
        a = np.stack([reference(row, *on) for row in LOGITS])
        b = np.stack([reference(row, *off) for row in LOGITS])
        se = np.sqrt(np.maximum(a * (1 - a), b * (1 - b)) / 12_000)
        print(on, "vs", off, "max gap in standard errors", (np.abs(a - b) / np.maximum(se, 1e-12)).max())
        assert (np.abs(a - b) > 20 * se + 1e-3).any()


def test_greedy_is_the_argmax_and_ignores_the_seed():
    a = generate(FixedLogits(LOGITS, 3), np.zeros((6, 1), np.int64), 4, seed=1).tokens
    b = generate(FixedLogits(LOGITS, 3), np.zeros((6, 1), np.int64), 4, seed=2).tokens
    assert (a == b).all() and (a[:3] == 0).all() and (a[3:] == 2).all()


class Scripted:
    """Row r emits script[r][step] greedily (a one-hot logit), so EOS arrives at a chosen step per row."""

    def __init__(self, script):
        self.script, self.t, self.fed = np.asarray(script), 0, []

    def _logits(self):
        out = np.zeros((len(self.script), 1, V), np.float32)
        out[np.arange(len(self.script)), 0, self.script[:, self.t]] = 5.0
        return out

    def prefill(self, ids, mask):
        return self._logits(), None

    def step(self, ids, cache, mask):
        self.fed.append(ids[:, 0].copy())
        self.t += 1
        return self._logits(), None


def test_eos_stops_each_row_of_a_batch():
    """Rows hit EOS (id 9 or 10, both listed) at steps 2, 4 and never: each stops there, pads after, the loop ends at
    max_new_tokens; with every row finished it ends at the last EOS."""
    script = [[1, 9, 3, 3, 3, 3], [2, 2, 2, 10, 4, 4], [5, 6, 7, 8, 5, 6]]
    s = Scripted(script)
    res = generate(s, np.zeros((3, 2), np.int64), 6, eos_token_id=[9, 10], pad_token_id=0)
    print(res.tokens, res.finished, res.lengths)
    assert res.tokens.tolist() == [[1, 9, 0, 0, 0, 0], [2, 2, 2, 10, 0, 0], [5, 6, 7, 8, 5, 6]]
    assert res.finished.tolist() == [True, True, False] and res.lengths.tolist() == [2, 4, 6]
    assert [r.tolist() for r in (res.row(0), res.row(1), res.row(2))] == [[1], [2, 2, 2], [5, 6, 7, 8, 5, 6]]
    s = Scripted([row[:5] for row in script[:2]] + [[1, 1, 9, 1, 1]])
    res = generate(s, np.zeros((3, 2), np.int64), 5, eos_token_id=[9, 10], pad_token_id=0)
    assert res.tokens.shape == (3, 4) and s.t == 3, "every row finished at step 4: no further step runs"
    assert res.finished.all() and res.lengths.tolist() == [2, 4, 3]


@pytest.mark.parametrize("spread", [0.05, 8.0])
def test_top_p_over_a_vocabulary_larger_than_the_candidates(spread):
    """A vocabulary of 3,000 (more than generate.CANDIDATES): with a peaked row the nucleus lies among the partially
    sorted candidates, with a flat row (spread 0.05) it reaches past them and the row is sorted whole; both draw the
    reference distribution (frequencies of the 8 most probable tokens and of the rest, within 5 standard errors)."""
    from paddle_vha.serve import generate as gen

    rng = np.random.default_rng(7)
    row = (rng.standard_normal(3000) * spread).astype(np.float32)
    assert 3000 > gen.CANDIDATES
    want = reference(row, 1.0, 0, 0.9)
    counts = np.zeros(3000)
    for seed in range(4):
        res = generate(FixedLogits(row[None], 500), np.zeros((500, 1), np.int64), 6, do_sample=True, top_p=0.9,
                       seed=seed)
        counts += np.bincount(res.tokens.ravel(), minlength=3000)
    n = counts.sum()
    top = np.argsort(-want)[:8]
    groups = [counts[t] for t in top] + [n - counts[top].sum()]
    probs = [want[t] for t in top] + [1 - want[top].sum()]
    for got, p in zip(groups, probs):
        se = np.sqrt(p * (1 - p) / n)
        print(f"spread {spread}: freq {got / n:.4f} want {p:.4f} ({abs(got / n - p) / max(se, 1e-12):.2f} se)")
        assert abs(got / n - p) <= 5 * se + 1e-3
    assert counts[want == 0].sum() == 0, "a token outside the nucleus was sampled"
    kept = int((want > 0).sum())
    print(f"spread {spread}: nucleus of {kept} tokens ({'past' if kept > gen.CANDIDATES else 'within'} the candidates)")
    assert (kept > gen.CANDIDATES) == (spread < 1)
