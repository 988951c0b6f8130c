"""Does looking predict mattering? Ablation evidence for one model's heads, as plain numbers (no model).

`AblationEvidence` holds what `headscope.ablation_evidence` measured:

- `single[layer, head]`: the effect of ablating that head alone on the corpus, in the measure's own units
  (a decoder's change in next-token loss, an encoder's cosine of the ablated sentence embedding to the
  clean one);
- `importance[layer, head]`: gradient head importance over the same texts (Michel et al. 2019);
- `induction` (decoders): the top-K induction heads ablated together against random sets of K;
- `choices`: per probe task, the cloze check of its chosen head (`ChoiceCheck.to_dict()`), or why not.

A head's single effect is compared with `n_random` other heads ablated alone, drawn by
`analyses.ablation.random_head_sets` from the same sweep, so no extra forward pass is needed.

Every table, CSV and run.json shows a head's effect as its *harm*, `ablation_harm`: one direction for
every model, higher = the ablation hurt more and 0 = it changed nothing — a decoder's rise in
next-token loss (nats), an encoder's 1 − cosine of the ablated sentence embedding to the clean one
(the cosine distance). The raw cosine (higher = *less* harm) never shares a column with a loss.

Rank correlation across heads, "does looking predict mattering?": Spearman's ρ between a metric's
score and the head's harm. Its 95% interval is the Fisher z-interval with the standard error
1.06 / √(n − 3) that Fieller, Hartley & Pearson (1957) give for Spearman's ρ:
tanh(atanh ρ ± 1.96 · 1.06 / √(n − 3)).

>>> r = spearman_interval([1, 2, 3, 4, 5, 6], [2, 1, 4, 3, 6, 5])  # ρ = 1 − 6·Σd²/(n(n²−1)) = 1 − 36/210
>>> round(r.rho, 3), r.n, [round(v, 3) for v in (r.low, r.high)]
(0.829, 6, [-0.016, 0.983])
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from headscope.probe.names import Stronger
from headscope.probe.types import head_name
from headscope.probe.wording import number

from .ablation import AblationResult, random_head_sets
from .stats import Z95, format_p

__all__ = ["AblationEvidence", "RankCorrelation", "role_grids", "spearman_interval", "INTERVAL_METHOD", "HARM_COLUMN"]

INTERVAL_METHOD = "Fisher z-interval, SE 1.06/√(n−3) (Fieller, Hartley & Pearson 1957)"
HARM_COLUMN = "ablation_harm"  # the one name of a head's oriented single-ablation effect, in every table

# The effect of an ablation that changes nothing, where it is not 0 (a difference): a cosine of 1.
_NO_CHANGE = {"sentence_cosine": 1.0, "word_cosine": 1.0}


@dataclass(frozen=True)
class RankCorrelation:
    """Spearman's ρ of `score` against the heads' harm over `n` heads, with its 95% interval."""

    score: str
    rho: float
    low: float
    high: float
    n: int

    def to_dict(self) -> dict:
        return {"score": self.score, "rho": self.rho, "ci95": [self.low, self.high], "n_heads": self.n,
                "interval": INTERVAL_METHOD}


def spearman_interval(x: Sequence[float], y: Sequence[float], *, score: str = "") -> RankCorrelation:
    """Spearman's ρ of x and y (ties get average ranks) and its Fisher-z 95% interval (nan when undefined)."""
    from scipy import stats

    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    n = len(x)
    if n < 4 or np.ptp(x) == 0 or np.ptp(y) == 0:  # a constant has no ranks to correlate
        return RankCorrelation(score, math.nan, math.nan, math.nan, n)
    rho = float(stats.spearmanr(x, y).statistic)
    z, se = math.atanh(min(max(rho, -0.999999), 0.999999)), 1.06 / math.sqrt(n - 3)
    return RankCorrelation(score, rho, math.tanh(z - Z95 * se), math.tanh(z + Z95 * se), n)


def role_grids(scores) -> dict[str, np.ndarray]:
    """`[layer, head]` grids of the metrics of `scores` that name a role, where every head has a score."""
    from .metrics import METRICS

    out = {}
    for m in scores.metrics:
        if METRICS[m].role is None:
            continue
        g = scores.grid(m).to_numpy(dtype=float)
        if np.isfinite(g).all():
            out[m] = g
    return out


@dataclass(frozen=True, eq=False)
class AblationEvidence:
    """Single-head effects, importance, the induction ablation and the cloze checks of one model."""

    model: str
    method: str
    effect_metric: str
    description: str
    stronger: Stronger
    n_texts: int
    single: Any  # [layer, head] float tensor: the effect of ablating each head alone
    importance: Any = None  # [layer, head] gradient importance (normalised per layer), or None
    importance_loss: str = ""
    induction: AblationResult | None = None
    choices: Mapping[str, dict] | None = None  # probe task -> ChoiceCheck.to_dict() + template, or {"skipped": why}
    n_random: int = 19
    seed: int = 0

    @property
    def harm(self) -> np.ndarray:
        """[layer, head]: the single effect as harm — higher = the ablation hurt more, 0 = no change.

        A loss change stays as it is; an effect where lower means more (a logit difference) is negated;
        a cosine becomes 1 − cosine.
        """
        s = np.asarray(self.single, dtype=float)
        unchanged = _NO_CHANGE.get(self.effect_metric, 0.0)
        return s - unchanged if self.stronger == "higher" else unchanged - s

    @property
    def harm_description(self) -> str:
        """What `harm` is, in words, with its unit."""
        if self.stronger == "higher":
            return self.description
        if self.effect_metric in _NO_CHANGE:
            return f"1 − {self.description} (cosine distance)"
        return f"−({self.description})"

    def head_effect(self, layer: int, head: int) -> AblationResult:
        """The head's harm alone against `n_random` other heads' harm alone, all read from the sweep."""
        harm = self.harm
        sets = random_head_sets(*harm.shape, [(layer, head)], 1, self.n_random, seed=self.seed)
        return AblationResult(model=self.model, heads=((layer, head),), method=self.method,
                              effect_metric=self.effect_metric, effect=float(harm[layer, head]),
                              random_effects=tuple(float(harm[s[0]]) for s in sets), stronger="higher",
                              n=self.n_texts, description=self.harm_description)

    def importance_rank(self) -> np.ndarray | None:
        """[layer, head]: 1 for the most important head of the model, ties broken by (layer, head)."""
        if self.importance is None:
            return None
        imp = np.asarray(self.importance, dtype=float)
        order = sorted(np.ndindex(imp.shape), key=lambda lh: (-imp[lh], lh))
        rank = np.zeros(imp.shape, dtype=int)
        for r, lh in enumerate(order, start=1):
            rank[lh] = r
        return rank

    def correlations(self, scores=None) -> tuple[RankCorrelation, ...]:
        """Spearman ρ across heads of each role metric of `scores` (`HeadScores`) and of the importance with the harm.

        Metrics that name a role (`analyses.metrics.METRICS`) and have a score for every head are used.
        """
        harm = self.harm.ravel()
        grids = {} if scores is None else role_grids(scores)
        if self.importance is not None:
            grids["gradient importance"] = self.importance
        return tuple(spearman_interval(np.asarray(g, dtype=float).ravel(), harm, score=name)
                     for name, g in grids.items())

    def roles_table(self, roles):
        """The roles table (`HeadScores.roles`) with each head's importance rank and single-ablation harm.

        `ablation_harm` (`HARM_COLUMN`), `random_mean` and `random_sd` are harm (higher = hurt more, see `harm`)."""
        rank = self.importance_rank()
        frame = roles.copy()
        effects = [self.head_effect(int(l), int(h)) for l, h in zip(frame["layer"], frame["head"])]
        if rank is not None:
            frame["importance_rank"] = [int(rank[int(l), int(h)]) for l, h in zip(frame["layer"], frame["head"])]
        frame[HARM_COLUMN] = [e.effect for e in effects]
        frame["random_mean"] = [e.random_mean for e in effects]
        frame["random_sd"] = [e.random_sd for e in effects]
        frame["p_vs_random"] = [e.p_value for e in effects]
        return frame

    def role_verdicts(self, roles, *, top: int = 1) -> list[tuple[str, str]]:
        """(roles, sentence) for the `top` heads of each role by score: their effect against random heads. A head
        that tops several roles is said once, its roles joined ("previous token and next token")."""
        by_head: dict[tuple[int, int], list[str]] = {}
        for role, rows in roles.groupby("role", sort=False):
            for r in rows.sort_values("value", ascending=False).head(top).itertuples():
                names = by_head.setdefault((int(r.layer), int(r.head)), [])
                if role not in names:
                    names.append(role)
        return [(" and ".join(names), self.head_sentence(*head)) for head, names in by_head.items()]

    def head_sentence(self, layer: int, head: int) -> str:
        """'ablating L9H4 changes the next-token loss by +0.12 nats; random 1-head ablations 0.01 ± 0.02 (p = 0.05, 19 draws)'.

        Every number is harm (`harm`): the random heads' too."""
        e = self.head_effect(layer, head)
        what = (f"changes the next-token loss by {number(e.effect, sign=True)} nats"
                if self.effect_metric == "next_token_loss"
                else f"moves the sentence embedding away from the clean one by 1 − cosine = {number(e.effect)}"
                if self.effect_metric == "sentence_cosine"
                else f"has harm {number(e.effect, sign=True)} ({self.harm_description})")
        if not e.random_effects:
            return f"ablating {head_name(layer, head)} {what}."
        return (f"ablating {head_name(layer, head)} {what}; random 1-head ablations {number(e.random_mean)} ± "
                f"{number(e.random_sd)} ({format_p(e.p_value, floor=None)}, {len(e.random_effects)} draws)")

    def to_dict(self, scores=None) -> dict:
        harm = self.harm
        L, H = harm.shape
        rank = self.importance_rank()
        heads = [{"head": head_name(l, h), HARM_COLUMN: float(harm[l, h]),
                  **({} if rank is None else {"importance": float(np.asarray(self.importance)[l, h]),
                                              "importance_rank": int(rank[l, h])})}
                 for l in range(L) for h in range(H)]
        return {
            # what was measured, and the one number per head shown for it: harm, higher = hurt more
            "method": self.method, "effect_metric": self.effect_metric, "description": self.description,
            "harm": self.harm_description, "harm_direction": "higher = the ablation hurt more; 0 = no change",
            "n_texts": self.n_texts, "n_random": self.n_random, "seed": self.seed,
            "importance_loss": self.importance_loss or None, "heads": heads,
            "induction": None if self.induction is None else self.induction.to_dict(),
            "choices": dict(self.choices or {}),
            "correlations": [c.to_dict() for c in self.correlations(scores)],
        }
