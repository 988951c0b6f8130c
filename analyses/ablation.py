"""Is an ablation's effect larger than ablating random heads? Pure numbers, no model.

The effect of ablating the chosen heads is compared with the effects of `n` random head sets of
the same size (drawn by `random_head_sets`, never containing a chosen head):

    p = (1 + #{random sets whose effect is at least as strong}) / (1 + n)

the empirical p-value with the +1 correction (Davison & Hinkley 1997; North et al. 2002), so p is
never 0 and its smallest value is 1 / (n + 1). "At least as strong" follows the metric's direction:
a higher loss, or a lower logit difference or cosine.

>>> r = AblationResult(model="m", heads=((1, 2),), method="zero", effect_metric="next_token_loss",
...                    effect=0.9, random_effects=(0.1, 0.2, 0.95, 0.0), stronger="higher", baseline=3.0, n=10)
>>> r.p_value, round(r.random_mean, 3)
(0.4, 0.312)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from headscope.probe.names import Stronger
from headscope.probe.types import head_name

from .stats import format_p

__all__ = ["AblationResult", "ChoiceCheck", "empirical_p", "random_head_sets", "ALPHA"]

ALPHA = 0.05  # a verdict calls an effect stronger than random at p <= ALPHA (19 draws: p = 0.05 at best)


def empirical_p(effect: float, random_effects: Sequence[float], *, stronger: Stronger) -> float | None:
    """`(1 + #random at least as strong as effect) / (1 + n)`; None without random draws.

    >>> empirical_p(2.0, [0.0, 1.0, 2.0], stronger="higher"), empirical_p(2.0, [0.0, 1.0, 2.0], stronger="lower")
    (0.5, 1.0)
    """
    r = np.asarray(random_effects, dtype=float)
    if r.size == 0:
        return None
    hits = (r >= effect) if stronger == "higher" else (r <= effect)
    return float((1 + hits.sum()) / (1 + r.size))


def random_head_sets(layers: int | Sequence[int], n_heads: int, exclude: Sequence[tuple[int, int]], size: int, n: int,
                     *, seed: int = 0) -> list[tuple[tuple[int, int], ...]]:
    """`n` sets of `size` distinct heads drawn uniformly from those not in `exclude` (a private generator), of
    `layers`: their count, or the model's own numbers of the layers that have heads (a hybrid stack's attention
    layers, Mllama's self-attention layers: a random set never holds a head that is not there).

    >>> sets = random_head_sets(2, 2, [(0, 0)], 2, 50, seed=0)
    >>> sorted(set(sets))  # every pair of the three other heads, never (0, 0)
    [((0, 1), (1, 0)), ((0, 1), (1, 1)), ((1, 0), (1, 1))]
    """
    if n == 0:
        return []
    excluded = set(exclude)
    pool = [(l, h) for l in (range(layers) if isinstance(layers, int) else layers) for h in range(n_heads)
            if (l, h) not in excluded]
    if size > len(pool):
        raise ValueError(f"cannot draw {size} random heads from the {len(pool)} heads outside the chosen set")
    rng = np.random.default_rng(seed)
    return [tuple(sorted(pool[i] for i in rng.choice(len(pool), size=size, replace=False))) for _ in range(n)]


@dataclass(frozen=True)
class AblationResult:
    """The effect of ablating `heads` by `method`, beside the effects of random head sets of that size.

    `effect` is the metric's change (see `probe.effects`); `baseline` the clean value of the metric's
    readout (the mean loss, logit difference, or 1.0 for a cosine); `n` the examples measured.
    """

    model: str
    heads: tuple[tuple[int, int], ...]
    method: str
    effect_metric: str
    effect: float
    random_effects: tuple[float, ...]
    stronger: Stronger
    baseline: float = math.nan
    n: int = 0
    description: str = ""
    extra: dict = field(default_factory=dict, compare=False)  # task settings (sequences, seed, ...)

    @property
    def random_mean(self) -> float:
        return float(np.mean(self.random_effects)) if self.random_effects else math.nan

    @property
    def random_sd(self) -> float:
        return float(np.std(self.random_effects, ddof=1)) if len(self.random_effects) > 1 else math.nan

    @property
    def p_value(self) -> float | None:
        return empirical_p(self.effect, self.random_effects, stronger=self.stronger)

    @property
    def verdict(self) -> str:
        """One sentence: the effect, the random distribution, and whether the heads matter more."""
        names = "+".join(head_name(l, h) for l, h in self.heads)
        what = self.description or self.effect_metric
        head = f"ablating {names} ({self.method}): {what} {self.effect:+.4g}"
        k = len(self.heads)
        if not self.random_effects:
            return head + "; no random head sets were drawn, so there is nothing to compare it with."
        rand = (f"; {len(self.random_effects)} random sets of {k} head{'s' if k > 1 else ''}: "
                f"{self.random_mean:+.4g} ± {self.random_sd:.3g}")
        p = self.p_value
        if p <= ALPHA:
            return f"{head}{rand} — a stronger effect than random heads ({format_p(p, floor=None)})."
        return f"{head}{rand} — not a stronger effect than random heads give ({format_p(p, floor=None)})."

    def to_dict(self) -> dict:
        return {
            "model": self.model,
            "heads": [head_name(l, h) for l, h in self.heads],
            "method": self.method,
            "effect_metric": self.effect_metric,
            "effect": self.effect,
            "baseline": self.baseline,
            "n": self.n,
            "random": {"mean": self.random_mean, "sd": self.random_sd, "n": len(self.random_effects)},
            "p_value": self.p_value,
            "verdict": self.verdict,
            "random_effects": list(self.random_effects),
            "settings": dict(self.extra),
        }


@dataclass(frozen=True)
class ChoiceCheck:
    """How ablating `heads` moves a decoder's choice between continuations, against random head sets.

    `before`, `after` and each of `random_after` hold one preference per example: log P(right
    option) − max log P(other options) (`probe.effects.option_preference`), clean, with `heads`
    ablated, and with each random set ablated. `delta` is the mean change; an example *flips* when
    its preference changes sign (the preferred option changes). Both are compared with the random
    sets as `empirical_p`: a lower delta, or more flips, counts as at least as strong.
    """

    model: str
    heads: tuple[tuple[int, int], ...]
    method: str
    before: tuple[float, ...]
    after: tuple[float, ...]
    random_after: tuple[tuple[float, ...], ...]

    @property
    def n(self) -> int:
        return len(self.before)

    @property
    def delta(self) -> float:
        return float((np.asarray(self.after) - np.asarray(self.before)).mean())

    @property
    def random_deltas(self) -> tuple[float, ...]:
        return tuple(float((np.asarray(r) - np.asarray(self.before)).mean()) for r in self.random_after)

    @property
    def p_value(self) -> float:
        p = empirical_p(self.delta, self.random_deltas, stronger="lower")
        return 1.0 if p is None else p  # (1 + 0) / (1 + 0) without random sets

    def _flips(self, after: Sequence[float]) -> int:
        return int(((np.asarray(self.before) > 0) != (np.asarray(after) > 0)).sum())

    @property
    def flips(self) -> int:
        return self._flips(self.after)

    @property
    def random_flips(self) -> tuple[int, ...]:
        return tuple(self._flips(r) for r in self.random_after)

    @property
    def flips_p_value(self) -> float | None:
        return empirical_p(self.flips, self.random_flips, stronger="higher")

    @property
    def verdict(self) -> str:
        """The mean shift of the preference, the right-preferred counts, and the random sets."""
        before, after, rd = np.asarray(self.before), np.asarray(self.after), np.asarray(self.random_deltas)
        names = "+".join(head_name(l, h) for l, h in self.heads)
        n, k, delta, p = self.n, len(rd), self.delta, self.p_value
        return (f"ablating {names} moves the preference for the right option by {delta:+.3f} nats on average "
                f"(right preferred in {int((before > 0).sum())}/{n} -> {int((after > 0).sum())}/{n}); "
                f"{k} random sets of {len(self.heads)} head(s): {rd.mean():+.3f} ± {rd.std(ddof=1) if k > 1 else 0:.3f}; "
                + (f"a larger drop than random ({format_p(p, floor=None)})." if p < ALPHA and delta < 0 else
                   f"not a larger drop than random heads give ({format_p(p, floor=None)})."))

    @property
    def flips_verdict(self) -> str:
        """'ablating L9H4 flips 12/40 preferences; random 1-head ablations flip 0.4 ± 0.8 (p = 0.05)'."""
        names = "+".join(head_name(l, h) for l, h in self.heads)
        rf = np.asarray(self.random_flips, dtype=float)
        k = len(self.heads)
        text = f"ablating {names} ({self.method}) flips {self.flips}/{self.n} cloze preferences"
        if not rf.size:
            return text + "; no random head sets were drawn."
        sd = rf.std(ddof=1) if rf.size > 1 else 0.0
        return (f"{text}; random {k}-head ablations flip {rf.mean():.1f} ± {sd:.1f} "
                f"({format_p(self.flips_p_value, floor=None)}, {rf.size} draws).")

    def to_dict(self) -> dict:
        before, after = np.asarray(self.before), np.asarray(self.after)
        return {
            "model": self.model, "heads": [{"layer": l, "head": h} for l, h in self.heads], "n": self.n,
            "preference_before": float(before.mean()), "preference_after": float(after.mean()),
            "delta": self.delta, "right_before": int((before > 0).sum()), "right_after": int((after > 0).sum()),
            "random_deltas": list(self.random_deltas), "p_value": self.p_value, "verdict": self.verdict,
            "method": self.method, "flips": self.flips, "random_flips": list(self.random_flips),
            "flips_p_value": self.flips_p_value, "flips_verdict": self.flips_verdict,
        }
