"""Activation patching, the numbers: pairs, per-pair effects, bootstrap intervals, a held-out check against random heads.

The model side is `probe.patching` (it runs the patches); here is everything that needs no model:

- the pairs: `PatchPair` (clean, corrupt, right, wrong), read from JSONL by `read_pairs`, or a built-in
  set (`builtin_pairs`): "ioi" (indirect-object templates, Wang et al. 2022: the repeated name swapped,
  so the answer swaps) and "agreement" (subject–verb agreement with the subject's number flipped);
- `PatchResult`: the metric of every pair with every site patched (`values[site, pair]`), the clean
  and corrupt metrics, a tidy table with each site's mean, its effect, the effect normalised
  (0 = the corrupt run, 1 = the clean run) and a bootstrap 95% interval over pairs;
- `Confirmation`: heads chosen on half of the pairs (the k whose patch moves the metric most toward the
  other run), their joint patch measured on the other half against random head sets of the same size,
  and the verdict in words — "no head's patch effect exceeds random heads" is a valid outcome.

A patch's *strength* on a pair is how far it moves the metric from the base run toward the source run,
in the direction of clean − corrupt: denoising (value − corrupt) and noising (clean − value), both
multiplied by the sign of the mean clean − corrupt difference. Strength over the mean |clean − corrupt|
is the fraction restored (denoise) or destroyed (noise).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from headscope.probe.names import PatchDirection as Direction
from headscope.probe.types import Viewable, head_name

from .ablation import ALPHA, empirical_p
from .stats import format_p

__all__ = ["PatchPair", "read_pairs", "builtin_pairs", "BUILTIN_PAIRS", "bootstrap_ci", "split_halves", "strength",
           "top_sites", "Confirmation", "PatchResult", "site_name", "HEAD_KINDS", "AttributionPatching"]


@dataclass(frozen=True)
class PatchPair:
    """A clean prompt, its corrupted twin (same length in tokens), and the right and wrong next token."""

    clean: str
    corrupt: str
    right: str
    wrong: str


def read_pairs(path: str | Path) -> list[PatchPair]:
    """Pairs from a JSONL file, one object per line: {"clean", "corrupt", "right", "wrong"}."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: no such file; give a JSONL file of {{\"clean\", \"corrupt\", \"right\", \"wrong\"}}"
                         " or a built-in set (ioi, agreement)")
    pairs = []
    for i, line in enumerate(path.read_text(encoding="utf-8-sig").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}, line {i}: not JSON ({exc.msg})") from None
        missing = [k for k in ("clean", "corrupt", "right", "wrong") if not isinstance(obj, dict)
                   or not isinstance(obj.get(k), str) or not obj.get(k)]
        if missing:
            raise ValueError(f"{path}, line {i}: needs the text fields {', '.join(missing)}")
        pairs.append(PatchPair(obj["clean"], obj["corrupt"], obj["right"], obj["wrong"]))
    if not pairs:
        raise ValueError(f"{path}: no pairs in the file")
    return pairs


_NAMES = ("Mary", "John", "Tom", "Anna", "James", "Sarah", "David", "Emma")
_IOI = (
    "When {a} and {b} went to the store, {s} gave a drink to",
    "When {a} and {b} went to the park, {s} gave a ball to",
    "After {a} and {b} had lunch, {s} handed the bill to",
    "Then, {a} and {b} were working at the office. {s} sent an email to",
    "While {a} and {b} were cooking dinner, {s} passed the salt to",
)
_AGREEMENT = (  # (singular, plural) subjects; the attractor has the other number
    ("key", "keys", "cabinet", "cabinets", "to the"),
    ("dog", "dogs", "neighbour", "neighbours", "of the"),
    ("author", "authors", "book", "books", "of the"),
    ("teacher", "teachers", "student", "students", "near the"),
    ("car", "cars", "house", "houses", "outside the"),
    ("picture", "pictures", "wall", "walls", "on the"),
    ("road", "roads", "village", "villages", "to the"),
    ("boy", "boys", "school", "schools", "from the"),
)


def _ioi() -> list[PatchPair]:
    pairs = []
    for t, template in enumerate(_IOI):
        for i in range(0, len(_NAMES), 2):
            a, b = _NAMES[(i + t) % len(_NAMES)], _NAMES[(i + t + 1) % len(_NAMES)]
            for x, y in ((a, b), (b, a)):
                # clean: the repeated name is y, so the answer is x; corrupt repeats x instead
                pairs.append(PatchPair(template.format(a=x, b=y, s=y), template.format(a=x, b=y, s=x),
                                       f" {x}", f" {y}"))
    return pairs


def _agreement() -> list[PatchPair]:
    pairs = []
    for sg, pl, att_sg, att_pl, prep in _AGREEMENT:
        pairs.append(PatchPair(f"The {sg} {prep} {att_pl}", f"The {pl} {prep} {att_pl}", " is", " are"))
        pairs.append(PatchPair(f"The {pl} {prep} {att_sg}", f"The {sg} {prep} {att_sg}", " are", " is"))
        pairs.append(PatchPair(f"The {sg} {prep} {att_sg}", f"The {pl} {prep} {att_sg}", " was", " were"))
    return pairs


BUILTIN_PAIRS = {"ioi": _ioi, "agreement": _agreement}


def builtin_pairs(name: str) -> list[PatchPair]:
    """A built-in pair set: "ioi" (40 indirect-object pairs) or "agreement" (24 subject–verb pairs).

    >>> p = builtin_pairs("ioi")[0]
    >>> p.clean, p.corrupt, p.right, p.wrong
    ('When Mary and John went to the store, John gave a drink to', 'When Mary and John went to the store, Mary gave a drink to', ' Mary', ' John')
    """
    if name not in BUILTIN_PAIRS:
        raise ValueError(f"unknown built-in pair set {name!r}; choose one of {', '.join(BUILTIN_PAIRS)} or give a file")
    return BUILTIN_PAIRS[name]()


# --------------------------------------------------------------------------------------------
# Statistics


def bootstrap_ci(values: np.ndarray, *, n_boot: int = 2000, seed: int = 0, denominator: np.ndarray | None = None
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Percentile bootstrap 95% interval of the mean over pairs (axis -1) of `values` ([..., pair]);
    with `denominator` ([pair]) of the ratio mean(values) / mean(denominator), resampled together.

    >>> lo, hi = bootstrap_ci(np.ones(10))
    >>> float(lo), float(hi)
    (1.0, 1.0)
    """
    v = np.asarray(values, dtype=np.float64)
    n = v.shape[-1]
    if n == 0:
        nan = np.full(v.shape[:-1], np.nan)
        return nan, nan
    idx = np.random.default_rng(seed).integers(0, n, size=(n_boot, n))  # (B, n)
    means = v[..., idx].mean(-1)  # (..., B)
    if denominator is not None:
        d = np.asarray(denominator, dtype=np.float64)[idx].mean(-1)  # (B,)
        with np.errstate(divide="ignore", invalid="ignore"):
            means = means / d
    return np.nanpercentile(means, 2.5, axis=-1), np.nanpercentile(means, 97.5, axis=-1)


def split_halves(n: int, *, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The pairs split at random into a selection half and a held-out half (sorted indices).

    >>> a, b = split_halves(5)
    >>> sorted(a.tolist() + b.tolist()), len(a), len(b)
    ([0, 1, 2, 3, 4], 2, 3)
    """
    order = np.random.default_rng(seed).permutation(n)
    return np.sort(order[: n // 2]), np.sort(order[n // 2 :])


def strength(values: np.ndarray, clean: np.ndarray, corrupt: np.ndarray, direction: Direction) -> np.ndarray:
    """How far each patch moves each pair's metric from the base run toward the source run ([..., pair]).

    >>> strength(np.array([[0.5, 1.0]]), np.array([1.0, 1.0]), np.array([0.0, 0.0]), "denoise").tolist()
    [[0.5, 1.0]]
    """
    sign = 1.0 if float(np.mean(clean - corrupt)) >= 0 else -1.0
    moved = values - corrupt if direction == "denoise" else clean - values
    return sign * moved


def top_sites(score: np.ndarray, k: int) -> list[int]:
    """Indices of the k largest scores (ties: the lower index first)."""
    order = np.lexsort((np.arange(len(score)), -np.asarray(score, dtype=np.float64)))
    return [int(i) for i in order[:k]]


HEAD_KINDS = ("head", "q", "k", "v", "pattern")  # sites that belong to one head


def site_name(site: tuple) -> str:
    """`L3H1`, `L3H1.q` (its q, k, v or pattern), `L3.mlp`, `L3.resid` or `L3.resid@5`."""
    kind, layer, x = site
    if kind == "head":
        return head_name(layer, x)
    if kind in HEAD_KINDS:
        return f"{head_name(layer, x)}.{kind}"
    if kind == "mlp":
        return f"L{layer}.mlp"
    return f"L{layer}.resid" + ("" if x is None else f"@{x}")


@dataclass(frozen=True, eq=False)
class Confirmation:
    """Heads chosen on the selection pairs, their joint patch on the held-out pairs against random head sets."""

    heads: tuple[tuple[int, int], ...]
    direction: Direction
    selection: tuple[int, ...]  # pair indices the heads were chosen on
    heldout: tuple[int, ...]  # pair indices the effect is measured on
    per_pair: np.ndarray  # [held-out pair] strength of the chosen heads' joint patch
    gap: np.ndarray  # [held-out pair] |clean − corrupt| in the direction of the mean
    random_sets: tuple[tuple[tuple[int, int], ...], ...]
    random_fractions: np.ndarray  # [random set] fraction moved on the held-out pairs
    n_heads: int  # heads the choice was among

    @property
    def fraction(self) -> float:
        """Mean strength over the mean gap on the held-out pairs (1 = all the way to the other run)."""
        g = float(self.gap.mean())
        return float(self.per_pair.mean()) / g if g else math.nan

    @property
    def ci(self) -> tuple[float, float]:
        lo, hi = bootstrap_ci(self.per_pair, denominator=self.gap)
        return float(lo), float(hi)

    @property
    def p_value(self) -> float | None:
        return empirical_p(self.fraction, self.random_fractions.tolist(), stronger="higher")

    @property
    def verdict(self) -> str:
        names = "+".join(head_name(l, h) for l, h in self.heads)
        verb = "restores" if self.direction == "denoise" else "removes"
        k = len(self.heads)
        lo, hi = self.ci
        head = (f"patching {names} (the {k} strongest of {self.n_heads} heads on {len(self.selection)} selection pairs) "
                f"{verb} {self.fraction:.0%} of the clean − corrupt logit difference on {len(self.heldout)} held-out "
                f"pairs (95% CI {lo:.0%}–{hi:.0%})")
        if not len(self.random_fractions):
            return head + "; no random head sets were drawn to compare with."
        r = self.random_fractions
        plural = "restore" if self.direction == "denoise" else "remove"
        spread = r.std(ddof=1) if len(r) > 1 else 0.0
        rand = f"; {len(r)} random sets of {k} heads {plural} {r.mean():.0%} ± {spread:.0%}"
        p = self.p_value
        if p is not None and p <= ALPHA and self.fraction > r.mean():
            return f"{head}{rand} — stronger than random heads ({format_p(p, floor=None)})."
        return f"no head's patch effect exceeds random heads: {head}{rand} ({format_p(p, floor=None)})."

    def to_dict(self) -> dict:
        lo, hi = self.ci
        return {"heads": [head_name(l, h) for l, h in self.heads], "selection_pairs": list(self.selection),
                "heldout_pairs": list(self.heldout), "fraction": self.fraction, "ci95": [lo, hi],
                "per_pair_strength": self.per_pair.tolist(), "random_fractions": self.random_fractions.tolist(),
                "p_value": self.p_value, "verdict": self.verdict}


@dataclass(frozen=True, eq=False)
class PatchResult(Viewable):
    """The metric (logit(right) − logit(wrong) at the last token) of every pair with each site patched.

    `values[site, pair]`; `clean[pair]` and `corrupt[pair]` are the unpatched runs. `to_frame()` is
    one row per site: its mean value, effect (value − the base run's mean: corrupt when denoising,
    clean when noising), normalised ((value − corrupt) / (clean − corrupt): 0 = corrupt, 1 = clean;
    NaN when clean == corrupt) and a bootstrap 95% interval of the effect over pairs.
    """

    model: str
    what: str
    direction: Direction
    sites: tuple[tuple, ...]
    values: np.ndarray  # [site, pair]
    clean: np.ndarray  # [pair]
    corrupt: np.ndarray  # [pair]
    pairs: tuple[PatchPair, ...]
    confirmation: Confirmation | None = None
    dropped: int = 0  # built-in pairs left out: their clean and corrupt prompts differ in length for this tokenizer
    seconds: float = math.nan
    forwards: int = 0
    sender: tuple[int, int] | None = None  # path patching: the sender head (layer, head)

    @property
    def base(self) -> np.ndarray:
        return self.corrupt if self.direction == "denoise" else self.clean

    def to_frame(self) -> pd.DataFrame:
        effect = self.values - self.base  # [site, pair]
        lo, hi = bootstrap_ci(effect)
        gap = float(self.clean.mean() - self.corrupt.mean())
        mean = self.values.mean(-1)
        with np.errstate(divide="ignore", invalid="ignore"):
            normalised = (mean - self.corrupt.mean()) / gap if abs(gap) > 1e-12 else np.full(len(mean), np.nan)
        rows = []
        for i, site in enumerate(self.sites):
            kind, layer, x = site
            rows.append({"site": site_name(site), "kind": kind, "layer": layer,
                         "head": x if kind in HEAD_KINDS else None, "position": x if kind == "resid" else None,
                         "value": float(mean[i]), "effect": float(effect[i].mean()), "normalised": float(normalised[i]),
                         "effect_ci_low": float(lo[i]), "effect_ci_high": float(hi[i])})
        frame = pd.DataFrame(rows)
        frame[["head", "position"]] = frame[["head", "position"]].astype("Int64")
        return frame

    def grid(self, column: str = "normalised") -> pd.DataFrame:
        """Head sites as a layer × head frame of `column`."""
        f = self.to_frame()
        f = f[f["kind"].isin(HEAD_KINDS)]
        return f.pivot(index="layer", columns="head", values=column).astype(float)

    @property
    def verdict(self) -> str:
        if self.confirmation is not None:
            return self.confirmation.verdict
        return "no held-out check: it needs head_out patching and at least 4 pairs."

    def summary(self) -> str:
        f = self.to_frame()
        top = f.reindex(f["effect"].abs().sort_values(ascending=False).index).head(3)
        best = ", ".join(f"{r.site} {r.normalised:.2f}" for r in top.itertuples())
        what = self.what if self.sender is None else f"path ({head_name(*self.sender)} → receivers' inputs)"
        return (f"{self.model}: {what} patching ({self.direction}) on {len(self.pairs)} pairs; logit difference "
                f"clean {self.clean.mean():.3f}, corrupt {self.corrupt.mean():.3f}; largest (normalised, 0 = corrupt, "
                f"1 = clean): {best}. {self.verdict}")

    def to_dict(self) -> dict:
        f = self.to_frame()
        out = {"model": self.model, "what": self.what, "direction": self.direction, "n_pairs": len(self.pairs),
               "dropped_pairs": self.dropped, "clean": float(self.clean.mean()), "corrupt": float(self.corrupt.mean()),
               "clean_per_pair": self.clean.tolist(), "corrupt_per_pair": self.corrupt.tolist(),
               "seconds": self.seconds, "forwards": self.forwards}
        cols = ["value", "effect", "normalised", "effect_ci_low", "effect_ci_high"]
        if self.sender is not None:
            out["sender"] = head_name(*self.sender)
        if self.what in ("head_out", "q", "k", "v", "pattern", "path"):
            out["heads"] = [{"layer": int(r["layer"]), "head": int(r["head"]),
                             **({"input": r["kind"]} if self.what == "path" else {}), **{c: r[c] for c in cols}}
                            for r in f.to_dict(orient="records")]
        else:
            out["sites"] = [{"site": r["site"], "layer": int(r["layer"]),
                             "position": None if pd.isna(r["position"]) else int(r["position"]),
                             **{c: r[c] for c in cols}} for r in f.to_dict(orient="records")]
        out["confirmation"] = None if self.confirmation is None else self.confirmation.to_dict()
        out["verdict"] = self.verdict
        return out


@dataclass(frozen=True, eq=False)
class AttributionPatching(Viewable):
    """Attribution patching (the gradient approximation) beside real patching on the same pairs.

    `estimate` holds the approximated metric of every site and pair (a `PatchResult`, its `seconds` the
    gradient pass's); `real` the real patches (None when not run). `spearman` is the rank correlation
    (scipy) of the two over sites, of the mean effect over pairs.
    """

    estimate: PatchResult
    real: PatchResult | None = None

    @property
    def spearman(self) -> float | None:
        if self.real is None:
            return None
        from scipy.stats import spearmanr

        a = (self.estimate.values - self.estimate.base).mean(-1)
        b = (self.real.values - self.real.base).mean(-1)
        if np.ptp(a) == 0 or np.ptp(b) == 0:
            return math.nan
        return float(spearmanr(a, b).statistic)

    def to_frame(self) -> pd.DataFrame:
        """One row per site: the estimated effect (and the real one, where run) averaged over pairs."""
        f = self.estimate.to_frame()[["site", "kind", "layer", "head", "position", "effect", "normalised"]]
        f = f.rename(columns={"effect": "estimated_effect", "normalised": "estimated_normalised"})
        if self.real is not None:
            r = self.real.to_frame()
            f["real_effect"], f["real_normalised"] = r["effect"].to_numpy(), r["normalised"].to_numpy()
        return f

    def summary(self) -> str:
        e = self.estimate
        f = self.to_frame()
        top = f.reindex(f["estimated_effect"].abs().sort_values(ascending=False).index).head(3)
        best = ", ".join(f"{r.site} {r.estimated_normalised:.2f}" for r in top.itertuples())
        text = (f"{e.model}: attribution patching of {e.what} ({e.direction}) on {len(e.pairs)} pairs in "
                f"{e.seconds:.2f} s; largest estimates (normalised): {best}.")
        if self.real is not None:
            text += (f" Spearman rank correlation with real patching over {len(f)} sites: {self.spearman:.3f} "
                     f"(real patching {self.real.seconds:.2f} s).")
        return text

    def to_dict(self) -> dict:
        return {"model": self.estimate.model, "what": self.estimate.what, "direction": self.estimate.direction,
                "n_pairs": len(self.estimate.pairs), "spearman": self.spearman,
                "seconds_attribution": self.estimate.seconds,
                "seconds_real": None if self.real is None else self.real.seconds,
                "sites": self.to_frame().to_dict(orient="records"), "summary": self.summary()}

