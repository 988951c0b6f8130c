"""Small, honest statistics for head probes: Wilson intervals, group k-fold, permutation tests, Holm.

Everything works on plain arrays of per-example outcomes (torch tensors or numpy arrays), so each
piece can be checked by hand. Permutation p-values are real Monte Carlo computations with a fixed
seed, vectorised in chunks, and use the (1 + count) / (1 + R) form, which is never 0 and is valid
for a finite R. The permutation engine runs on numpy: its many small products stay fast on a busy
CPU, where torch's thread pool can stall for milliseconds on each.
"""

from __future__ import annotations

import math
from typing import Sequence, overload

import numpy as np

__all__ = [
    "Z95",
    "wilson",
    "group_folds",
    "ranked_argmax",
    "signflip_max_p",
    "relabel_max_p",
    "cv_choices",
    "cv_signflip_p",
    "cv_relabel_p",
    "holm",
    "format_p",
]

Z95 = 1.959963984540054  # two-sided 95% normal quantile


def wilson(correct: int, n: int, *, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval for `correct` successes out of `n` (NaNs when n = 0).

    >>> lo, hi = wilson(38, 40)
    >>> f"{lo:.4f} {hi:.4f}"
    '0.8350 0.9862'
    """
    if n < 0 or not 0 <= correct <= n:
        raise ValueError(f"need 0 <= correct <= n, got correct={correct}, n={n}")
    if n == 0:
        return math.nan, math.nan
    p = correct / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    # At 0 or n successes the bound is exactly 0 or 1; float rounding would leave 1e-17 off.
    lo = 0.0 if correct == 0 else max(0.0, centre - half)
    hi = 1.0 if correct == n else min(1.0, centre + half)
    return lo, hi


def group_folds(groups: Sequence[str], k: int, *, seed: int = 0) -> list[int]:
    """A fold number (0..k-1) per example; all examples of a group land in the same fold.

    Groups are shuffled with `seed`, then dealt largest first to the fold with the fewest
    examples so far, which keeps folds balanced in examples (not just in groups).

    >>> group_folds(["a", "a", "b", "b", "c", "d"], 2)
    [0, 0, 1, 1, 0, 1]
    """
    if k < 2:
        raise ValueError(f"k-fold needs k >= 2, got {k}")
    order = list(dict.fromkeys(groups))
    if len(order) < k:
        raise ValueError(f"{len(order)} group(s) cannot fill {k} folds; use fewer folds or more data")
    shuffled = [order[i] for i in np.random.default_rng(seed).permutation(len(order))]
    size = {g: 0 for g in order}
    for g in groups:
        size[g] += 1
    shuffled.sort(key=lambda g: -size[g])  # stable: ties keep their shuffled order
    load = [0] * k
    fold_of: dict[str, int] = {}
    for g in shuffled:
        f = min(range(k), key=lambda i: (load[i], i))
        fold_of[g] = f
        load[f] += size[g]
    return [fold_of[g] for g in groups]


def ranked_argmax(totals, rank) -> np.ndarray:
    """Position of the largest of integer `totals` along the last axis; ties go to the larger `rank`.

    `rank` holds a number per position, distinct numbers 0..m-1 (a fixed seeded order:
    `analyses.selection.head_rank`) so the choice is unique, or zeros (ties: the first).

    >>> int(ranked_argmax([3, 5, 5, 1], [3, 0, 2, 1])), ranked_argmax([[1, 1], [0, 2]], [1, 0]).tolist()
    (2, [0, 1])
    """
    t = np.asarray(totals, dtype=np.float64)
    return (t * (t.shape[-1] + 1) + np.asarray(rank, dtype=np.float64)).argmax(axis=-1)


def _p_from_null(observed: float, null: np.ndarray) -> float:
    # Integer-valued statistics: compare with a small slack so float sums cannot flip an equality.
    count = int((null >= observed - 1e-9).sum())
    return (1 + count) / (1 + null.size)


def _as2d(x, dtype) -> np.ndarray:
    a = np.asarray(x, dtype=dtype)
    return a[:, None] if a.ndim == 1 else a


def _signs(rng: np.random.Generator, r: int, n: int) -> np.ndarray:
    return rng.integers(0, 2, size=(r, n)).astype(np.float64) * 2 - 1  # (R, n) of +-1


def _draws(rng: np.random.Generator, r: int, k: np.ndarray, c_max: int) -> np.ndarray:
    """(R, n * c_max) one-hot of an answer drawn uniformly among each example's k candidates."""
    draw = np.floor(rng.random((r, k.size)) * k).astype(np.int64)  # (R, n)
    onehot = np.zeros((r, k.size, c_max))
    np.put_along_axis(onehot, draw[:, :, None], 1.0, axis=2)
    return onehot.reshape(r, -1)


def _picks_matrix(pred: np.ndarray, c_max: int) -> np.ndarray:
    """(n, c_max, m): 1 where column m picks candidate c on example n (a pick of -1 marks nothing)."""
    n, m = pred.shape
    picks = np.zeros((n, c_max, m))
    ex_idx, col_idx = np.nonzero(pred >= 0)
    picks[ex_idx, pred[ex_idx, col_idx], col_idx] = 1
    return picks


def signflip_max_p(diff, *, n_perm: int = 10_000, seed: int = 0, chunk: int = 500) -> float:
    """One-sided paired permutation test of "column beats baseline", max over columns.

    `diff[example, column]` = outcome of a head minus outcome of the baseline on that example
    (-1, 0 or +1 for right/wrong outcomes). Under H0 each example's head and baseline outcomes
    are exchangeable, so the sign of each example's row may be flipped — the same flip for every
    column, which keeps the dependence between heads. The statistic is max over columns of the
    summed difference; with one column this is a Monte Carlo McNemar (sign) test.

    >>> round(signflip_max_p(np.ones(100)), 4)   # a head right on 100 examples the baseline missed
    0.0001
    """
    d = _as2d(diff, np.float64)  # (example, column)
    if d.shape[0] == 0:
        return math.nan
    observed = float(d.sum(0).max())
    rng = np.random.default_rng(seed)
    nulls = [(_signs(rng, min(chunk, n_perm - s), d.shape[0]) @ d).max(axis=1) for s in range(0, n_perm, chunk)]
    return _p_from_null(observed, np.concatenate(nulls))


def relabel_max_p(pred, answer, n_candidates, *, n_perm: int = 10_000, seed: int = 0, chunk: int = 250) -> float:
    """One-sided permutation test of "column beats chance", max over columns.

    `pred[example, column]` is the candidate each head picks (-1 for no pick, e.g. a tie),
    `answer[example]` the right one, `n_candidates[example]` how many there are. Under H0 the
    attention carries no information about which candidate is right, so the answer label is
    redrawn uniformly among each example's candidates — the same draw for every column. The
    statistic is max over columns of the number correct.

    >>> pred = np.zeros(100, dtype=int)                      # always picks candidate 0 ...
    >>> round(relabel_max_p(pred, np.zeros(100, dtype=int), np.full(100, 2)), 4)   # ... which is right
    0.0001
    """
    pred = _as2d(pred, np.int64)  # (example, column)
    if pred.shape[0] == 0:
        return math.nan
    answer, k = np.asarray(answer, dtype=np.int64), np.asarray(n_candidates, dtype=np.int64)
    c_max = int(k.max())
    observed = float((pred == answer[:, None]).sum(0).max())
    picks = _picks_matrix(pred, c_max).reshape(-1, pred.shape[1])  # (n * c_max, m)
    rng = np.random.default_rng(seed)
    nulls = [(_draws(rng, min(chunk, n_perm - s), k, c_max) @ picks).max(axis=1) for s in range(0, n_perm, chunk)]
    return _p_from_null(observed, np.concatenate(nulls))


# --------------------------------------------------------------------------------------------
# Tests of the whole k-fold procedure
#
# Pooling the held-out outcomes of k folds and testing them as if they were independent is NOT
# valid: the head chosen for fold 1 was chosen on folds 2..k, whose outcomes are scored too, so
# a head that is lucky everywhere is chosen everywhere and its luck counts k times (on pure noise
# such a test rejected 7 times in 40 at alpha = 0.05). These tests re-run the selection inside
# every permutation, so the null distribution is that of the whole procedure.


def _fold_index(folds: Sequence[int]) -> list[np.ndarray]:
    f = np.asarray(list(folds))
    return [np.nonzero(f == k)[0] for k in sorted(set(f.tolist()))]


def _cv_stat(held: list[np.ndarray], rank: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
    """Summed held-out score of the column chosen on the other folds; `held[f]` is (R, m) per-fold sums.

    The choice is the largest training sum, ties broken by `rank` (`ranked_argmax`).
    """
    total = sum(held)
    out = np.zeros(total.shape[0])
    chosen = []
    for h in held:
        sel = ranked_argmax(total - h, rank)  # (R,)
        out += np.take_along_axis(h, sel[:, None], axis=1)[:, 0]
        chosen.append(sel)
    return out, chosen


def cv_choices(correct, folds: Sequence[int], rank) -> list[int]:
    """The column chosen for each fold: most correct on the other folds, ties by `rank`.

    `correct[example, column]`; returns one column index per fold (folds in sorted order).

    >>> cv_choices([[1, 0], [1, 1], [0, 1], [0, 1]], [0, 0, 1, 1], [0, 1])
    [1, 0]
    """
    c = _as2d(correct, np.float64)
    held = [c[idx].sum(0, keepdims=True) for idx in _fold_index(folds)]
    _, chosen = _cv_stat(held, np.asarray(rank, dtype=np.float64))
    return [int(x[0]) for x in chosen]


def cv_signflip_p(diff, folds: Sequence[int], rank, *, n_perm: int = 10_000, seed: int = 0, chunk: int = 250) -> float:
    """One-sided test of "the k-fold-chosen head beats the baseline on held-out examples".

    `diff[example, column]` = head outcome minus baseline outcome (choosing by the largest sum of
    differences is choosing by accuracy, as the baseline is the same for every head). Each
    permutation flips the sign of each example's row (the same flip for all columns), re-runs the
    k-fold choice and recomputes the pooled held-out sum.
    """
    d = _as2d(diff, np.float64)  # (example, column)
    rank = np.asarray(rank, dtype=np.float64)
    index = _fold_index(folds)
    observed = float(_cv_stat([d[idx].sum(0, keepdims=True) for idx in index], rank)[0][0])
    rng = np.random.default_rng(seed)
    nulls = []
    for start in range(0, n_perm, chunk):
        signs = _signs(rng, min(chunk, n_perm - start), d.shape[0])
        nulls.append(_cv_stat([signs[:, idx] @ d[idx] for idx in index], rank)[0])  # (R,)
    return _p_from_null(observed, np.concatenate(nulls))


def cv_relabel_p(pred, answer, n_candidates, folds: Sequence[int], rank, *, n_perm: int = 10_000, seed: int = 0,
                 chunk: int = 100) -> float:
    """One-sided test of "the k-fold-chosen head beats chance on held-out examples".

    Each permutation redraws every answer uniformly among its example's candidates (the same draw
    for all columns), re-runs the k-fold choice and recomputes the pooled held-out number correct.
    """
    pred = _as2d(pred, np.int64)  # (example, column)
    n, m = pred.shape
    answer, k = np.asarray(answer, dtype=np.int64), np.asarray(n_candidates, dtype=np.int64)
    c_max = int(k.max())
    rank = np.asarray(rank, dtype=np.float64)
    picks = _picks_matrix(pred, c_max)  # (n, c_max, m)
    index = _fold_index(folds)
    correct = (pred == answer[:, None]).astype(np.float64)
    observed = float(_cv_stat([correct[idx].sum(0, keepdims=True) for idx in index], rank)[0][0])
    rng = np.random.default_rng(seed)
    nulls = []
    for start in range(0, n_perm, chunk):
        r = min(chunk, n_perm - start)
        onehot = _draws(rng, r, k, c_max).reshape(r, n, c_max)
        held = [onehot[:, idx].reshape(r, -1) @ picks[idx].reshape(-1, m) for idx in index]  # (R, m) per fold
        nulls.append(_cv_stat(held, rank)[0])
    return _p_from_null(observed, np.concatenate(nulls))


# --------------------------------------------------------------------------------------------
# Many tests at once, and p-values in words


@overload
def holm(p_values: np.ndarray) -> np.ndarray: ...


@overload
def holm(p_values: Sequence[float | None]) -> list[float | None]: ...


def holm(p_values):
    """Holm's step-down adjustment (family-wise error) of the p-values given; a missing one stays missing.

    The m p-values present are sorted; the i-th smallest (i from 0) is multiplied by m - i, capped
    at 1, and never left below the adjusted value before it. A numpy array gives an array, NaN (or
    any non-finite entry) marking a test not run (NaN out); any other sequence gives a list, None
    (or NaN) marking one and kept as it was.

    >>> holm([0.01, None, 0.04, 0.03])
    [0.03, None, 0.06, 0.06]
    >>> holm(np.array([0.01, 0.04, np.nan, 0.03])).round(3).tolist()
    [0.03, 0.06, nan, 0.06]
    """
    if isinstance(p_values, np.ndarray):
        return _holm(p_values)
    given = list(p_values)
    adjusted = _holm(np.array([math.nan if p is None else p for p in given], dtype=np.float64))
    return [p if p is None or not math.isfinite(p) else float(q) for p, q in zip(given, adjusted)]


def _holm(p: np.ndarray) -> np.ndarray:
    out = np.full_like(p, np.nan, dtype=np.float64)
    idx = np.flatnonzero(np.isfinite(p))
    order = idx[np.argsort(p[idx], kind="stable")]
    m = len(order)
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p[i]))
        out[i] = running
    return out


def format_p(p: float, *, floor: float | None = 0.001) -> str:
    """A p-value for a sentence: two significant digits, or `p < floor` below `floor`.

    Below 0.001 the digits of a Monte Carlo p-value say little (it is at least 1 / (1 + draws));
    `floor=None` writes every p as it is (the ablation checks, with a few random head sets).

    >>> format_p(0.0432), format_p(0.0004), format_p(1.0), format_p(0.00067, floor=None)
    ('p = 0.043', 'p < 0.001', 'p = 1', 'p = 0.00067')
    """
    return f"p < {floor:g}" if floor is not None and p < floor else f"p = {p:.2g}"
