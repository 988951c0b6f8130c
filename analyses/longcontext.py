"""Heads for long context, the statistics: Wu et al.'s retrieval score, the causal check and the result of
`headscope retrieval`. No model (the model side is `probe.longcontext`; the plan and needles `probe.kvplan`).

Retrieval score (Wu et al. 2024, "Retrieval Head"): while the model generates its answer greedily, a step
whose new token w occurs in the needle is a copy step; head h hits at that step when its top-attended key
lies inside the needle and holds the token w. The score is hits / copy steps, with a Wilson 95% interval.
With no copy step (the model wrote no token of any needle) the score is undefined: NaN in the arrays and
tables (an empty CSV cell), null in `to_dict`, and `NO_COPIES` in words wherever heads would be ranked.
A KV cache stores keys per KV head, so a grouped-query model's score per KV head is the largest score of the
query heads that read it (the cache must keep a key if any of its readers retrieves through it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import pandas as pd

from headscope.probe.kvplan import KVPlan, Needle, gate_table, pool_kv
from headscope.probe.types import head_name

from .ablation import ALPHA
from .stats import format_p, wilson

__all__ = ["NO_COPIES", "NeedleHits", "RetrievalScores", "RetrievalCheck", "RetrievalResult", "accuracy_p", "combined_rank", "curve_verdicts"]


NO_COPIES = "no copy steps: the model copied no needle token, so no head has a retrieval score"


def combined_rank(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Two [layer, KV head] scores (higher: keep full) as one: the mean of each cell's rank share under each
    (0 the lowest, 1 the highest; ties share their mean rank); NaN where either is NaN.

    >>> combined_rank(np.array([[0.9, 0.1, 0.5]]), np.array([[1.0, 3.0, 2.0]])).tolist()
    [[0.5, 0.5, 0.5]]
    """
    a, b = np.asarray(a, float), np.asarray(b, float)
    if a.shape != b.shape:
        raise ValueError(f"the two scores have shapes {a.shape} and {b.shape}")
    ok = np.isfinite(a) & np.isfinite(b)
    out = np.full(a.shape, np.nan)
    if ok.sum() == 1:
        out[ok] = 1.0
    elif ok.any():
        share = lambda x: (pd.Series(x).rank(method="average").to_numpy() - 1) / (x.size - 1)  # noqa: E731
        out[ok] = (share(a[ok]) + share(b[ok])) / 2
    return out


def curve_verdicts(costs: pd.DataFrame, *, fraction: float = 0.5, keep: float = 0.75, ppl: float = 0.03,
                   margin: float = 30.0) -> list[str]:
    """In words, per ranking at `fraction` of full KV heads (the nearest the curve has): the needle accuracy kept
    as a share of the full model's (≥ `keep`?), the perplexity change (≤ `ppl`?), and the points above the
    median random plan of the same size (≥ `margin`?)."""
    full = costs[costs["kind"] == "all full"]
    if full.empty:
        return []
    base_acc, out = float(full["needle_accuracy"].iloc[0]), []
    inner = costs[(costs["fraction_full"] > 0) & (costs["fraction_full"] < 1)]
    if inner.empty:
        return []
    at = inner["fraction_full"].iloc[(inner["fraction_full"] - fraction).abs().argmin()]
    here = inner[np.isclose(inner["fraction_full"], at)]
    rnd = here[here["kind"] == "random"]
    median = float(rnd["needle_accuracy"].median()) if not rnd.empty else math.nan
    for _, row in here[here["kind"] != "random"].iterrows():
        acc, change = float(row["needle_accuracy"]), float(row["perplexity_change"])
        kept = acc / base_acc if base_acc else math.nan
        above = 100 * (acc - median)
        ok = kept >= keep and change <= ppl and above >= margin
        share = f"{kept:.0%} of the full model's {base_acc:.0%}" if base_acc else "the full model retrieves none"
        out.append(f"{row['plan']} ({int(row['n_full'])} KV heads full, {float(row['kv_share']):.0%} of the full "
                   f"cache): needle accuracy {acc:.0%} ({share}, n = "
                   f"{int(row['needles'])}), perplexity {change:+.1%}, {above:+.0f} points over the median of "
                   f"{len(rnd)} random plans ({median:.0%}) — "
                   + ("meets" if ok else "misses") + f" keep ≥ {keep:.0%}, perplexity ≤ {ppl:+.0%}, ≥ {margin:.0f} "
                   "points over random.")
    return out


@dataclass(frozen=True, eq=False)
class RetrievalScores:
    """Wu et al.'s retrieval score of every head over the copy steps of some needles."""

    model: str
    hits: np.ndarray  # [layer, head] int
    copies: int  # copy steps (the denominator of every head)
    n_kv_heads: int
    needles: tuple[int, ...] = ()  # the needles scored

    @property
    def scored(self) -> bool:
        """Whether any step copied a needle token: without one no head has a score (`NO_COPIES`)."""
        return self.copies > 0

    @property
    def score(self) -> np.ndarray:
        """[layer, head] hits / copy steps; NaN everywhere when there is no copy step (undefined, not 0)."""
        return self.hits / self.copies if self.copies else np.full(self.hits.shape, np.nan)

    def interval(self, layer: int, head: int) -> tuple[float, float]:
        return wilson(int(self.hits[layer, head]), self.copies)

    def kv_score(self) -> np.ndarray:
        """[layer, KV head]: the pooled score (`pool_kv`: the largest of its query heads')."""
        return pool_kv(self.score, self.n_kv_heads)

    def top(self, k: int) -> tuple[tuple[int, int], ...]:
        """The k heads with the highest score (ties: the later layer, then the lower head); a ValueError
        (`NO_COPIES`) when there is no copy step, since then no order is meaningful."""
        if not self.scored:
            raise ValueError(NO_COPIES)
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


@dataclass(frozen=True, eq=False)
class NeedleHits:
    """One needle prompt answered greedily, step by step (what the explorer shows): the prompt's labels, the
    needle's token range [start, stop), each generated token, whether each step copied a needle token, each
    head's top-attended key per step (`[step, layer, head]`, -1 for a layer without attention) and whether it
    hit (`probe.longcontext.copy_steps`). `retrieved`: the key in the answer (None for a needle without one)."""

    model: str
    needle: Needle
    labels: tuple[str, ...]  # the prompt's tokens
    span: tuple[int, int]
    tokens: tuple[str, ...]  # the answer's tokens
    answer: str
    retrieved: bool | None
    copied: np.ndarray  # [step] bool
    top_keys: np.ndarray  # [step, layer, head] int
    hits: np.ndarray  # [step, layer, head] bool

    @property
    def scores(self) -> RetrievalScores:
        """Every head's retrieval score on this one prompt."""
        return RetrievalScores(model=self.model, hits=self.hits.sum(0, dtype=np.int64), copies=int(self.copied.sum()),
                               n_kv_heads=self.hits.shape[2], needles=(self.needle.index,))

    def head(self, layer: int, head: int) -> dict:
        """JSON-ready: one head's top key at each step (its position and label: a prompt token, or an answer token
        written before it), whether the step copied and whether the head hit; its hits / copies and score (None
        with no copy step, and `note` says why); and every head's score on the prompt ([layer][head], None alike)."""
        n = len(self.labels)
        keys = self.labels + self.tokens
        steps = []
        for t, tok in enumerate(self.tokens):
            k = int(self.top_keys[t, layer, head])
            steps.append({"token": tok, "copied": bool(self.copied[t]), "top": k,
                          "top_label": keys[k] if 0 <= k < len(keys) else None, "in_prompt": 0 <= k < n,
                          "in_needle": bool(self.span[0] <= k < self.span[1]), "hit": bool(self.hits[t, layer, head])})
        sc = self.scores
        grid = [[float(v) if sc.scored else None for v in row] for row in sc.score]
        lo, hi = sc.interval(layer, head) if sc.scored else (None, None)
        return {"layer": layer, "head": head, "name": head_name(layer, head), "steps": steps,
                "hits": int(sc.hits[layer, head]), "copies": sc.copies,
                "score": grid[layer][head], "interval": [lo, hi], "scores": grid,
                "note": None if sc.scored else f"{NO_COPIES} on this prompt"}


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
    KV heads full, ranked by `ranking`; DuoAttention's learned gates (optional)."""

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
    costs: pd.DataFrame | None = None  # the cost curve (`plan_cost`'s columns), when asked for
    gates: np.ndarray | None = None  # [layer, KV head] DuoAttention's learned gates, NaN where not planned

    def to_frame(self) -> pd.DataFrame:
        """One row per head: its retrieval score with counts and interval, and its KV head's pooled score,
        streaming sensitivity and place in the plan."""
        frame = self.scores.to_frame()
        kv = self.kv_frame().set_index(["layer", "kv_head"])
        for col in ("kv_retrieval_score", "stream_sensitivity", "gate", "full"):
            frame[col] = [kv.loc[(l, k), col] for l, k in zip(frame["layer"], frame["kv_head"])]
        return frame

    def gate_table(self) -> str | None:
        """The learned gates as DuoAttention's training writes them (`probe.kvplan.gate_table`); None without."""
        return None if self.gates is None else gate_table(self.gates)

    def kv_frame(self) -> pd.DataFrame:
        """One row per (layer, KV head): the pooled retrieval score (largest of its query heads'), the streaming
        sensitivity, DuoAttention's learned gate and whether the plan keeps it full."""
        pooled = self.scores.kv_score()
        rows = []
        for l, k in np.ndindex(pooled.shape):
            rows.append({"layer": l, "kv_head": k, "kv_retrieval_score": float(pooled[l, k]),
                         "stream_sensitivity": math.nan if self.sensitivity is None else float(self.sensitivity[l, k]),
                         "gate": math.nan if self.gates is None else float(self.gates[l, k]),
                         "planned": bool(self.plan.planned[l]), "full": bool(self.plan.full[l, k])})
        return pd.DataFrame(rows)

    def to_dict(self) -> dict:
        """JSON-ready: with no copy step `top_heads` is empty and `retrieval_note` says why (never a NaN score)."""
        top = self.scores.top(min(10, self.scores.hits.size)) if self.scores.scored else ()
        return {"model": self.model, "needles": [n.to_dict() for n in self.needles],
                "prompt_tokens": list(self.n_tokens), "selection_correct": list(self.selection_correct),
                "copy_steps": self.scores.copies, "retrieval_note": None if self.scores.scored else NO_COPIES,
                "top_heads": [{"head": head_name(l, h), "score": float(self.scores.score[l, h]),
                               "hits": int(self.scores.hits[l, h]), "interval": list(self.scores.interval(l, h))}
                              for l, h in top],
                "check": None if self.check is None else self.check.to_dict(),
                "plan": {"ranking": self.ranking, "fraction_full": self.plan.fraction_full, "n_full": self.plan.n_full,
                         "n_planned": self.plan.n_planned, **self.plan.pattern_config()},
                "curve": None if self.costs is None else self.costs.to_dict(orient="records"),
                "curve_verdicts": [] if self.costs is None else curve_verdicts(self.costs),
                "settings": dict(self.settings)}
