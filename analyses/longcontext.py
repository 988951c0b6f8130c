"""Heads for long context, the statistics: Wu et al.'s retrieval score, the causal check and the result of
`headscope retrieval`. No model (the model side is `probe.longcontext`; the plan and needles `probe.kvplan`).

Retrieval score (Wu et al. 2024, "Retrieval Head"): while the model generates its answer greedily, a step
whose new token w occurs in the needle is a copy step; head h hits at that step when its top-attended key
lies inside the needle and holds the token w. The score is hits / copy steps, with a Wilson 95% interval.
A KV cache stores keys per KV head, so a grouped-query model's score per KV head is the largest score of the
query heads that read it (the cache must keep a key if any of its readers retrieves through it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import pandas as pd

from headscope.probe.kvplan import KVPlan, Needle, pool_kv
from headscope.probe.types import head_name

from .ablation import ALPHA
from .stats import format_p, wilson

__all__ = ["RetrievalScores", "RetrievalCheck", "RetrievalResult", "accuracy_p"]


@dataclass(frozen=True, eq=False)
class RetrievalScores:
    """Wu et al.'s retrieval score of every head over the copy steps of some needles."""

    model: str
    hits: np.ndarray  # [layer, head] int
    copies: int  # copy steps (the denominator of every head)
    n_kv_heads: int
    needles: tuple[int, ...] = ()  # the needles scored

    @property
    def score(self) -> np.ndarray:
        return self.hits / self.copies if self.copies else np.full(self.hits.shape, np.nan)

    def interval(self, layer: int, head: int) -> tuple[float, float]:
        return wilson(int(self.hits[layer, head]), self.copies)

    def kv_score(self) -> np.ndarray:
        """[layer, KV head]: the pooled score (`pool_kv`: the largest of its query heads')."""
        return pool_kv(self.score, self.n_kv_heads)

    def top(self, k: int) -> tuple[tuple[int, int], ...]:
        """The k heads with the highest score (ties: the later layer, then the lower head)."""
        s = self.score
        cells = sorted(np.ndindex(s.shape), key=lambda c: (-s[c], -c[0], c[1]))
        return tuple((int(l), int(h)) for l, h in cells[:k])

    def to_frame(self) -> pd.DataFrame:
        rows = []
        for l, h in np.ndindex(self.hits.shape):
            lo, hi = self.interval(l, h)
            rows.append({"layer": l, "head": h, "name": head_name(l, h),
                         "kv_head": h // (self.hits.shape[1] // self.n_kv_heads),
                         "retrieval_hits": int(self.hits[l, h]), "copy_steps": self.copies,
                         "retrieval_score": float(self.score[l, h]), "retrieval_low": lo, "retrieval_high": hi})
        return pd.DataFrame(rows)


def accuracy_p(chosen: Sequence[float], random_sets: Sequence[Sequence[float]], *, n_perm: int = 10_000,
               seed: int = 0) -> float:
    """One-sided paired permutation p-value that masking the chosen heads costs more needles than random sets:
    per needle d = (mean correct over the random sets) − (correct with the chosen heads masked); the signs of d
    are flipped at random, p = (1 + #{flipped mean ≥ observed}) / (1 + n_perm).

    >>> accuracy_p([0, 0, 0, 0, 0, 0], [[1] * 6] * 10) < 0.05, accuracy_p([1] * 6, [[1] * 6] * 10)
    (True, 1.0)
    """
    c = np.asarray(chosen, dtype=float)
    r = np.asarray(random_sets, dtype=float)
    if r.ndim != 2 or r.shape[1] != c.size or r.shape[0] == 0:
        raise ValueError("random_sets must be draws × needles with the chosen set's needles")
    d = r.mean(0) - c
    observed = d.mean()
    rng = np.random.default_rng(seed)
    flips = rng.choice([-1.0, 1.0], size=(n_perm, d.size))
    null = (flips * d).mean(1)
    return float((1 + (null >= observed - 1e-12).sum()) / (1 + n_perm))


@dataclass(frozen=True)
class RetrievalCheck:
    """Needle accuracy on held-out needles: clean, with the chosen heads' outputs zeroed, and with random head
    sets of the same size zeroed (per needle, 1 retrieved / 0 not)."""

    model: str
    heads: tuple[tuple[int, int], ...]
    clean: tuple[int, ...]
    chosen: tuple[int, ...]
    random_sets: tuple[tuple[tuple[int, int], ...], ...]
    random: tuple[tuple[int, ...], ...]  # per draw, per needle
    extra: dict = field(default_factory=dict, compare=False)

    @property
    def n(self) -> int:
        return len(self.clean)

    def accuracy(self, outcomes: Sequence[int]) -> tuple[float, float, float]:
        """(accuracy, Wilson 95% low, high)."""
        k = int(sum(outcomes))
        return (k / len(outcomes), *wilson(k, len(outcomes))) if outcomes else (math.nan, math.nan, math.nan)

    @property
    def random_accuracies(self) -> tuple[float, ...]:
        return tuple(sum(r) / len(r) for r in self.random)

    @property
    def drop_beyond_random(self) -> float:
        """Points of accuracy (0–100) lost to the chosen heads beyond the mean random set."""
        return 100 * (float(np.mean(self.random_accuracies)) - self.accuracy(self.chosen)[0])

    @property
    def p_value(self) -> float:
        return accuracy_p(self.chosen, self.random)

    @property
    def verdict(self) -> str:
        names = "+".join(head_name(l, h) for l, h in self.heads)
        acc, ch, rnd = self.accuracy(self.clean)[0], self.accuracy(self.chosen)[0], self.random_accuracies
        head = (f"masking {len(self.heads)} heads ({names}): held-out needle accuracy {acc:.0%} → {ch:.0%} "
                f"(n = {self.n}); {len(rnd)} random sets of {len(self.heads)}: mean {np.mean(rnd):.0%} "
                f"(range {min(rnd):.0%}–{max(rnd):.0%})")
        p = self.p_value
        if p <= ALPHA and self.drop_beyond_random > 0:
            return f"{head} — these heads matter more for retrieval than random heads ({format_p(p, floor=None)})."
        return f"{head} — no head set matters more than random here ({format_p(p, floor=None)})."

    def to_dict(self) -> dict:
        acc = self.accuracy
        return {"model": self.model, "heads": [head_name(l, h) for l, h in self.heads], "n": self.n,
                "clean": dict(zip(("accuracy", "low", "high"), acc(self.clean))),
                "chosen": dict(zip(("accuracy", "low", "high"), acc(self.chosen))),
                "random": {"accuracies": list(self.random_accuracies), "n": len(self.random),
                           "mean": float(np.mean(self.random_accuracies))},
                "drop_beyond_random_points": self.drop_beyond_random, "p_value": self.p_value,
                "verdict": self.verdict, "settings": dict(self.extra)}


@dataclass(frozen=True, eq=False)
class RetrievalResult:
    """`headscope retrieval`: the needles, the retrieval scores on the selection half, the causal check on the
    held-out half, each KV head streamed alone (optional) and the plan that keeps `plan.fraction_full` of the
    KV heads full, ranked by `ranking`."""

    model: str
    needles: tuple[Needle, ...]
    selection_correct: tuple[int, ...]
    scores: RetrievalScores
    check: RetrievalCheck | None
    sensitivity: np.ndarray | None  # [layer, KV head] mean KL, NaN where not planned
    plan: KVPlan
    ranking: str
    n_tokens: tuple[int, ...]  # each needle prompt's length
    settings: dict = field(default_factory=dict, compare=False)

    def to_frame(self) -> pd.DataFrame:
        """One row per head: its retrieval score with counts and interval, and its KV head's pooled score,
        streaming sensitivity and place in the plan."""
        frame = self.scores.to_frame()
        kv = self.kv_frame().set_index(["layer", "kv_head"])
        for col in ("kv_retrieval_score", "stream_sensitivity", "full"):
            frame[col] = [kv.loc[(l, k), col] for l, k in zip(frame["layer"], frame["kv_head"])]
        return frame

    def kv_frame(self) -> pd.DataFrame:
        """One row per (layer, KV head): the pooled retrieval score (largest of its query heads'), the streaming
        sensitivity and whether the plan keeps it full."""
        pooled = self.scores.kv_score()
        rows = []
        for l, k in np.ndindex(pooled.shape):
            rows.append({"layer": l, "kv_head": k, "kv_retrieval_score": float(pooled[l, k]),
                         "stream_sensitivity": math.nan if self.sensitivity is None else float(self.sensitivity[l, k]),
                         "planned": bool(self.plan.planned[l]), "full": bool(self.plan.full[l, k])})
        return pd.DataFrame(rows)

    def to_dict(self) -> dict:
        top = self.scores.top(min(10, self.scores.hits.size))
        return {"model": self.model, "needles": [n.to_dict() for n in self.needles],
                "prompt_tokens": list(self.n_tokens), "selection_correct": list(self.selection_correct),
                "copy_steps": self.scores.copies,
                "top_heads": [{"head": head_name(l, h), "score": float(self.scores.score[l, h]),
                               "hits": int(self.scores.hits[l, h]), "interval": list(self.scores.interval(l, h))}
                              for l, h in top],
                "check": None if self.check is None else self.check.to_dict(),
                "plan": {"ranking": self.ranking, "fraction_full": self.plan.fraction_full, "n_full": self.plan.n_full,
                         "n_planned": self.plan.n_planned, **self.plan.pattern_config()},
                "settings": dict(self.settings)}
