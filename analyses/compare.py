"""Two checkpoints of one model, head by head: which metrics moved, with intervals over texts.

Both models read the same texts, so every metric of every head is a *paired* sample over texts:
`d_i = b_i - a_i`, the per-text value of model B minus model A (one text scored at a time by
`analyses.heads.HeadScoreAccumulator`). Per (head, metric):

- `a`, `b`: the mean per-text value (texts where the metric is not applicable, NaN, are left out of
  both; these means weigh texts equally, unlike `headscope heads`, which pools query rows);
- `diff` = mean of `d_i`, `ci95` its two-sided 95% Student-t interval (n - 1 degrees of freedom);
- `p`: the paired t-test of `d = 0`; when every `d_i` is equal the test is exact: p = 1 for all
  zeros (the head did not move at all) and p = 0 otherwise.

A head's metric is **changed** when both hold:
1. the Holm-adjusted p-value is below `alpha` (0.05), adjusting over every tested (head, metric)
   pair, so the chance of flagging any unchanged one stays at most `alpha` (family-wise), and
2. `|diff| >= min_effect` (`MIN_EFFECT`: 0.05 for attention shares and normalised scores; 0.1 nats
   for entropy), so a tiny but consistent shift over many texts is not called a change of role.

Roles (`analyses.heads.assign_roles`, its thresholds) are computed for each model on its scores
pooled over all texts — the same numbers as `headscope heads` — and `roles_changed` lists the
roles one model's head has and the other's lacks.

>>> import pandas as pd
>>> rows = lambda vals: pd.DataFrame({"text": range(len(vals)), "layer": 0, "head": 0, "metric": "self",
...                                   "value": vals, "n": 3})
>>> c = compare_scores(rows([0.1, 0.2, 0.3, 0.2]), rows([0.6, 0.8, 0.7, 0.7]), a_name="base", b_name="tuned")
>>> r = c.table.iloc[0]
>>> round(float(r["diff"]), 3), bool(r["changed"]), list(c.roles_changed["role"])
(0.5, True, ['self (current-token) head'])
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping

import numpy as np
import pandas as pd

from headscope.probe.names import DEFAULT_INCLUDE_SPECIAL, DEFAULT_LEVEL, Level
from headscope.probe.types import AttentionMap, json_safe

from .heads import HeadScoreAccumulator, assign_roles
from .stats import holm

__all__ = ["HeadComparison", "per_text_scores", "compare_scores", "MIN_EFFECT", "DEFAULT_MIN_EFFECT", "ALPHA"]

ALPHA = 0.05  # family-wise error rate over all (head, metric) pairs, Holm's step-down
DEFAULT_MIN_EFFECT = 0.05  # attention shares and scores in [0, 1]
MIN_EFFECT: Mapping[str, float] = {"entropy": 0.1}  # nats: the one metric not on a 0..1 scale

_KEY = ["layer", "head", "metric"]
_TABLE_COLUMNS = ["layer", "head", "metric", "a", "b", "diff", "ci_low", "ci_high", "n_texts", "p", "p_holm",
                  "changed"]


@dataclass(frozen=True, eq=False)
class HeadComparison:
    """Per (layer, head, metric) differences B - A over paired texts (`table`), role changes, the rule."""

    a: str
    b: str
    n_texts: int
    table: pd.DataFrame  # _TABLE_COLUMNS, one row per (layer, head, metric) with a value in both
    roles_changed: pd.DataFrame  # layer, head, role, in_a, in_b
    alpha: float = ALPHA

    @property
    def rule(self) -> str:
        effects = ", ".join(f"{m} {v:g}" for m, v in MIN_EFFECT.items())
        return (f"changed: paired t-test over texts, Holm-adjusted p < {self.alpha:g} across all "
                f"{int(self.table['p'].notna().sum())} (head, metric) pairs, and |diff| >= {DEFAULT_MIN_EFFECT:g} "
                f"({effects})")

    def changed(self) -> pd.DataFrame:
        """The changed rows, largest |diff| first."""
        rows = self.table[self.table["changed"]]
        return rows.reindex(rows["diff"].abs().sort_values(ascending=False).index).reset_index(drop=True)

    def changed_heads(self) -> list[tuple[int, int]]:
        """`(layer, head)` of every head with at least one changed metric, in order."""
        rows = self.table[self.table["changed"]]
        return sorted({(int(r.layer), int(r.head)) for r in rows.itertuples()})

    def grid(self, metric: str) -> pd.DataFrame:
        """`diff` of `metric` as a layer × head frame (index = layer, columns = head)."""
        rows = self.table[self.table["metric"] == metric]
        if rows.empty:
            raise KeyError(f"no compared values for metric {metric!r}; compared: {sorted(set(self.table['metric']))}")
        return rows.pivot(index="layer", columns="head", values="diff")

    def to_dict(self) -> dict:
        """JSON-ready: `a, b, n_texts, heads` (`{layer, head, metric, a, b, diff, ci95, changed}`), roles, rule."""
        heads = [{"layer": int(r.layer), "head": int(r.head), "metric": r.metric, "a": r.a, "b": r.b,
                  "diff": r.diff, "ci95": [r.ci_low, r.ci_high], "changed": bool(r.changed)}
                 for r in self.table.itertuples()]
        roles = [{"layer": int(r.layer), "head": int(r.head), "role": r.role, "in_a": bool(r.in_a),
                  "in_b": bool(r.in_b)} for r in self.roles_changed.itertuples()]
        return json_safe({"a": self.a, "b": self.b, "n_texts": self.n_texts, "heads": heads,
                          "roles_changed": roles, "rule": self.rule})


def per_text_scores(maps: Iterable[AttentionMap], *, level: Level = DEFAULT_LEVEL,
                    include_special: bool = DEFAULT_INCLUDE_SPECIAL) -> pd.DataFrame:
    """Every head's metrics on each text alone: `text, layer, head, metric, value, n` (text = 0, 1, ...)."""
    frames = []
    for i, amap in enumerate(maps):
        acc = HeadScoreAccumulator(level=level, include_special=include_special)
        acc.update(amap)
        frames.append(acc.result().table.drop(columns="model").assign(text=i))
    if not frames:
        raise ValueError("no attention maps were given; pass at least one text")
    return pd.concat(frames, ignore_index=True)[["text", *_KEY, "value", "n"]]


def compare_scores(a: pd.DataFrame, b: pd.DataFrame, *, a_name: str = "a", b_name: str = "b",
                   alpha: float = ALPHA, thresholds: Mapping[str, float] | None = None) -> HeadComparison:
    """Compare two `per_text_scores` tables of the same texts and heads (B - A), see the module doc."""
    wide_a, wide_b = _wide(a), _wide(b)
    if not wide_a.index.equals(wide_b.index) or not wide_a.columns.equals(wide_b.columns):
        raise ValueError("the two score tables cover different texts or heads; score the same texts with models "
                         "of the same architecture")
    va, vb = wide_a.to_numpy(np.float64), wide_b.to_numpy(np.float64)  # [text, (layer, head, metric)]
    both = np.isfinite(va) & np.isfinite(vb)
    d = np.where(both, vb - va, np.nan)
    n = both.sum(0)
    keep = n > 0  # metrics that apply (induction scores are not per-text: NaN everywhere, dropped)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_a = np.nanmean(np.where(both, va, np.nan)[:, keep], 0)
        mean_b = np.nanmean(np.where(both, vb, np.nan)[:, keep], 0)
        diff, lo, hi, p = _paired_t(d[:, keep], n[keep])
    table = wide_a.columns[keep].to_frame(index=False)
    table = table.assign(a=mean_a, b=mean_b, diff=diff, ci_low=lo, ci_high=hi, n_texts=n[keep], p=p, p_holm=holm(p))
    effect = table["metric"].map(lambda m: MIN_EFFECT.get(m, DEFAULT_MIN_EFFECT))
    table["changed"] = (table["p_holm"] < alpha) & (table["diff"].abs() >= effect)
    roles = _roles_changed(_pooled(a), _pooled(b), thresholds)
    return HeadComparison(a=a_name, b=b_name, n_texts=len(wide_a.index), table=table[_TABLE_COLUMNS],
                          roles_changed=roles, alpha=alpha)


def _wide(per_text: pd.DataFrame) -> pd.DataFrame:
    """text × (layer, head, metric) values, columns sorted."""
    return per_text.pivot_table(index="text", columns=_KEY, values="value", dropna=False, aggfunc="first").sort_index(
        axis=1)


def _paired_t(d: np.ndarray, n: np.ndarray):
    """Mean of the paired differences `d` ([text, pair], NaN = missing), its 95% t interval and p-value."""
    from scipy import stats

    tested = n >= 2  # a pair seen in one text (a metric that applies to one text only) has no spread to test
    mean, sd = np.full(d.shape[1], np.nan), np.full(d.shape[1], np.nan)
    seen = n >= 1
    mean[seen] = np.nanmean(d[:, seen], 0)
    sd[tested] = np.nanstd(d[:, tested], 0, ddof=1)  # only where n - 1 >= 1: no "degrees of freedom <= 0"
    with np.errstate(invalid="ignore", divide="ignore"):  # sd = 0: the exact case, set below
        se = sd / np.sqrt(np.maximum(n, 1))
        df = np.maximum(n - 1, 1)
        half = stats.t.ppf(0.975, df) * se
        p = 2 * stats.t.sf(np.abs(mean) / se, df)
    spread = np.zeros(d.shape[1])
    spread[tested] = np.nanmax(d[:, tested], 0) - np.nanmin(d[:, tested], 0)
    exact = tested & (spread == 0)  # every text moved by the same amount: the test is exact (sd is 0 but for rounding)
    p = np.where(exact, np.where(mean == 0, 1.0, 0.0), p)
    half = np.where(exact, 0.0, half)
    p = np.where(n >= 2, p, np.nan)  # one text: no interval, not tested
    return mean, mean - half, mean + half, p


def _pooled(per_text: pd.DataFrame) -> pd.DataFrame:
    """Per-text values pooled over query rows (`Σ value·n / Σ n`): the corpus scores of `headscope heads`."""
    t = per_text[per_text["n"] > 0].assign(weighted=lambda f: f["value"] * f["n"])
    g = t.groupby(_KEY, as_index=False)[["weighted", "n"]].sum()
    return g.assign(value=g["weighted"] / g["n"], model="")[["model", *_KEY, "value", "n"]]


def _roles_changed(pooled_a: pd.DataFrame, pooled_b: pd.DataFrame, thresholds) -> pd.DataFrame:
    ra = {(r.layer, r.head, r.role) for r in assign_roles(pooled_a, thresholds).itertuples()}
    rb = {(r.layer, r.head, r.role) for r in assign_roles(pooled_b, thresholds).itertuples()}
    rows = [{"layer": int(l), "head": int(h), "role": role, "in_a": (l, h, role) in ra, "in_b": (l, h, role) in rb}
            for l, h, role in sorted(ra ^ rb)]
    return pd.DataFrame(rows, columns=["layer", "head", "role", "in_a", "in_b"])
