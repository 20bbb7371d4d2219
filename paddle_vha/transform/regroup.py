"""Head regrouping for convert_to_vha: which old KV heads merge into each new KV head (docs/conversion.md).

The converter merges the m = H_kv_old / N old KV heads of each new group. By default the groups are contiguous
([0..m-1], [m..2m-1], ...); a trained model's similar heads need not sit next to each other, so regrouping picks a
partition of the old KV heads into N groups of m, non-contiguous allowed (e.g. [[0, 2, 6, 7], [1, 3, 4, 5]]):

    key-similarity  maximise the summed within-group cosine similarity of the heads' keys on calibration tokens,
                    cos(t, u) = E[k_t . k_u] / sqrt(E|k_t|^2 E|k_u|^2) with k_t = W_t x the key projection of head t
                    (before k_norm and RoPE, which act alike on every head); with M = E[x x^T] of the attention input,
                    E[k_t . k_u] = tr(W_t M W_u^T) (M = I without calibration: the weights' cosine)
    fit-error       minimise the fit errors the converter reports: the keys' mean-pooling residual (weight space)
                    plus the values' merge residual (the rank-d fit, in the calibrated metric for "calibrated";
                    the mean's residual for "mean"), each relative to its total, summed over the groups

Both objectives are sums over groups, so the best partition is found by exhaustive search when the partitions are
few (8 heads into 2 groups: 35; into 4: 105) and by a greedy start improved by pairwise swaps otherwise.

The query heads follow their KV head: a permutation `order` of the old KV heads (new head s is old head order[s])
permutes k_proj / v_proj row blocks, q_proj row blocks and o_proj column blocks of the query heads that read each KV
head; the permuted GQA model computes the same function (attention is a sum over heads), so converting it with
contiguous groups is the regrouped conversion and the written checkpoint is an ordinary Qwen3-VHA. Pure numpy.
"""
from __future__ import annotations

import itertools
import math
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np

__all__ = ["REGROUP", "key_similarity", "choose_groups", "head_order", "permute_heads", "permuted_reader",
           "partition_count", "best_partition"]

REGROUP = ("contiguous", "key-similarity", "fit-error")
EXHAUSTIVE_LIMIT = 20000  # partitions searched exhaustively; more -> greedy + swaps
PERMUTED = ("q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight", "q_proj.bias", "k_proj.bias",
            "v_proj.bias")  # (a bias, where the base has one, moves with its heads' rows)


def partition_count(n: int, m: int) -> int:
    """Partitions of n heads into n / m unordered groups of m."""
    k = n // m
    return math.factorial(n) // (math.factorial(m) ** k * math.factorial(k))


def _head_gram(w: np.ndarray, n: int, d: int, moment: Optional[np.ndarray]) -> np.ndarray:
    """G[t, u] = tr(W_t M W_u^T) for the n head blocks W_t (d x h) of w [n*d, h] (M = I when moment is None)."""
    blocks = np.asarray(w, np.float64).reshape(n, d, -1)  # (n, d, h)
    mb = blocks if moment is None else np.einsum("tdh,hk->tdk", blocks, moment)
    return np.einsum("tdh,udh->tu", mb, blocks)


def key_similarity(w_k: np.ndarray, n: int, d: int, moment: Optional[np.ndarray] = None) -> np.ndarray:
    """n x n cosine similarity of the heads' key projections (on the inputs whose second moment is `moment`)."""
    g = _head_gram(w_k, n, d, moment)
    norm = np.sqrt(np.clip(np.diag(g), 1e-300, None))
    return g / norm[:, None] / norm[None, :]


def _mean_residual(gram: np.ndarray, group: Sequence[int]) -> float:
    """sum_t |W_t - mean|^2 over the group, from the head Gram matrix."""
    sub = gram[np.ix_(group, group)]
    return float(np.trace(sub) - sub.sum() / len(group))


def _rank_residual(full: np.ndarray, group: Sequence[int], d: int) -> float:
    """Energy beyond the top d of [W_t^T]_t (h x m*d) in the metric: the rank-d fit's residual."""
    idx = np.concatenate([np.arange(t * d, (t + 1) * d) for t in group])
    lam = np.linalg.eigvalsh(full[np.ix_(idx, idx)])  # ascending: (m*d,)
    return float(np.clip(lam[:-d], 0.0, None).sum())


def _fit_cost(w_k, w_v, n: int, d: int, low_rank: bool, value_moment) -> Callable[[tuple], float]:
    """group -> its keys' relative mean residual + its values' relative merge residual (what merge_kv reports)."""
    gk = _head_gram(w_k, n, d, None)
    total_k = max(float(np.trace(gk)), 1e-300)
    if low_rank:
        v = np.asarray(w_v, np.float64)  # (n*d, h)
        full = v @ (v.T if value_moment is None else value_moment @ v.T)  # (n*d, n*d): V M V^T
        total_v = max(float(np.trace(full)), 1e-300)
        return lambda grp: _mean_residual(gk, grp) / total_k + _rank_residual(full, grp, d) / total_v
    gv = _head_gram(w_v, n, d, None)
    total_v = max(float(np.trace(gv)), 1e-300)
    return lambda grp: _mean_residual(gk, grp) / total_k + _mean_residual(gv, grp) / total_v


def _all_partitions(heads: tuple, m: int):
    if not heads:
        yield []
        return
    first, rest = heads[0], heads[1:]
    for others in itertools.combinations(rest, m - 1):
        left = tuple(h for h in rest if h not in others)
        for tail in _all_partitions(left, m):
            yield [(first,) + others] + tail


def _greedy(n: int, m: int, cost) -> List[tuple]:
    """Greedy start (each group grown from its lowest free head by the cheapest addition), then pairwise swaps
    between groups while one lowers the total."""
    free, groups = list(range(n)), []
    while free:
        grp = [free.pop(0)]
        while len(grp) < m:
            best = min(free, key=lambda h: cost(tuple(sorted(grp + [h]))))
            grp.append(best)
            free.remove(best)
        groups.append(tuple(sorted(grp)))
    improved = True
    while improved:
        improved = False
        for a, b in itertools.combinations(range(len(groups)), 2):
            for x, y in itertools.product(groups[a], groups[b]):
                ga = tuple(sorted([h for h in groups[a] if h != x] + [y]))
                gb = tuple(sorted([h for h in groups[b] if h != y] + [x]))
                if cost(ga) + cost(gb) < cost(groups[a]) + cost(groups[b]) - 1e-12:
                    groups[a], groups[b], improved = ga, gb, True
                    break
    return groups


def best_partition(n: int, m: int, cost: Callable[[tuple], float]) -> List[List[int]]:
    """The partition of heads 0..n-1 into groups of m minimising sum(cost(group)) (group: a sorted tuple);
    canonical: each group sorted, groups ordered by their first head."""
    cache: Dict[tuple, float] = {}

    def cached(grp: tuple) -> float:
        if grp not in cache:
            cache[grp] = cost(grp)
        return cache[grp]

    if partition_count(n, m) <= EXHAUSTIVE_LIMIT:
        best = min(_all_partitions(tuple(range(n)), m), key=lambda part: sum(cached(g) for g in part))
    else:
        best = _greedy(n, m, cached)
    return sorted([sorted(g) for g in best])


def choose_groups(how: str, w_k: np.ndarray, w_v: np.ndarray, n_old: int, n_new: int, head_dim: int,
                  moment: Optional[np.ndarray] = None, low_rank: bool = True,
                  value_moment: Optional[np.ndarray] = None) -> List[List[int]]:
    """The old KV heads of each new KV head (N lists of m head indices) for one layer, by `how` (REGROUP).

    moment: E[x x^T] of the attention input for key-similarity (None: the weights' cosine); value_moment: the metric
    of the values' rank-d fit for fit-error (the calibrated method's moment, else None); low_rank: whether the
    values are merged by the rank-d fit (svd / calibrated) or averaged (mean)."""
    m = n_old // n_new
    if how == "contiguous" or m == 1:
        return [list(range(g * m, (g + 1) * m)) for g in range(n_new)]
    if how == "key-similarity":
        sim = key_similarity(w_k, n_old, head_dim, moment)
        return best_partition(n_old, m, lambda grp: -sum(sim[t, u] for t, u in itertools.combinations(grp, 2)))
    if how == "fit-error":
        return best_partition(n_old, m, _fit_cost(w_k, w_v, n_old, head_dim, low_rank, value_moment))
    raise ValueError(f"regroup {how!r}: expected one of {', '.join(REGROUP)}")


def head_order(groups: Sequence[Sequence[int]]) -> List[int]:
    """The old KV head at each new position: the groups concatenated (new group g = positions g*m .. g*m+m-1)."""
    return [int(h) for grp in groups for h in grp]


def permute_heads(name: str, w: np.ndarray, order: Sequence[int], num_heads: int, n_kv: int,
                  head_dim: int) -> np.ndarray:
    """One attention tensor (on-disk layout) with the KV heads reordered to `order` and each query head following
    its KV head (their biases too); tensors other than q/k/v/o_proj are returned unchanged (q_norm / k_norm are shared
    by all heads, o_proj's bias is per hidden unit)."""
    d, group = head_dim, num_heads // n_kv
    q_order = [t * group + a for t in order for a in range(group)]  # new query head -> old query head
    w = np.asarray(w)
    if name.endswith(("k_proj.weight", "v_proj.weight", "k_proj.bias", "v_proj.bias")):
        return w.reshape(n_kv, d, -1)[list(order)].reshape(w.shape)  # (H_kv, d, h or 1) rows reordered
    if name.endswith(("q_proj.weight", "q_proj.bias")):
        return w.reshape(num_heads, d, -1)[q_order].reshape(w.shape)  # (H_q, d, h or 1)
    if name.endswith("o_proj.weight"):
        return w.reshape(w.shape[0], num_heads, d)[:, q_order].reshape(w.shape)  # (h, H_q, d) columns reordered
    return w


def permuted_reader(read: Callable[[str], np.ndarray], prefix: str, order: Sequence[int], num_heads: int,
                    n_kv: int, head_dim: int) -> Callable[[str], np.ndarray]:
    """read(name) with layer `prefix`'s q/k/v/o_proj permuted by `order` (permute_heads)."""
    def permuted(name: str) -> np.ndarray:
        w = read(name)
        if name.startswith(prefix) and name[len(prefix):] in PERMUTED:
            return permute_heads(name, w, order, num_heads, n_kv, head_dim)
        return w
    return permuted
