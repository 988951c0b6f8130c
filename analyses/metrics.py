"""The head metrics, defined once: `METRICS[name]` says what a metric measures, how it is computed,
its value range, and the role a head earns by reaching its threshold.

Everything else reads this registry by name: the order of the scores table and of the CSV
(`analyses.heads`), the roles and their thresholds, the figures' colour scales and labels and the
report's grids (`reports`). A new metric is one entry here plus its computation in `analyses.heads`,
keyed by the same name.

>>> [m for m, spec in METRICS.items() if spec.kind == "pattern"]
['duplicate_token', 'induction']
>>> THRESHOLDS["induction"], ROLE_LABELS["induction"]
(0.25, 'induction head')
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal, Mapping

__all__ = ["MetricName", "MetricKind", "Metric", "METRICS", "THRESHOLDS", "ROLE_LABELS"]

MetricName = Literal[
    "previous_token", "next_token", "self", "first_token", "cls", "sep", "punctuation",
    "entropy", "normalized_entropy", "max_weight", "duplicate_token", "induction",
]
# corpus: a mean over the query rows of attention maps of ordinary texts;
# pattern: TransformerLens's detection-pattern score on repeated random tokens (`analyses.induction`).
MetricKind = Literal["corpus", "pattern"]


@dataclass(frozen=True)
class Metric:
    """One head metric. `value_range` is the colour scale; an upper bound of None means "up to the
    largest value drawn" (entropy has no fixed maximum). `threshold` is the score at which a head
    gets `role` (both None when the metric names no role)."""

    name: MetricName
    measures: str
    kind: MetricKind
    value_range: tuple[float, float | None] = (0.0, 1.0)
    unit: str = ""
    role: str | None = None
    threshold: float | None = None
    applies_to: Literal["all", "encoders", "decoders"] = "all"

    @property
    def label(self) -> str:
        """The name as words, for titles and captions: "previous token"."""
        return self.name.replace("_", " ")


# Thresholds: 0.5 for attention shares is Clark et al.'s "more than half of its attention" (previous/next
# token heads, [SEP] heads). A perfect induction or duplicate-token head scores about 0.5 under
# TransformerLens's definition (the first copy has nothing to match), so 0.25 means about half its
# attention in the second copy goes to the target.
_ALL = (
    Metric("previous_token", "attention to the previous unit, A[q, q-1]", "corpus",
           role="previous-token head", threshold=0.5),
    Metric("next_token", "attention to the next unit, A[q, q+1] (none under a causal mask)", "corpus",
           role="next-token head", threshold=0.5, applies_to="encoders"),
    Metric("self", "attention to the query's own unit, A[q, q]", "corpus",
           role="self (current-token) head", threshold=0.5),
    Metric("first_token", "attention to position 0, whatever it is", "corpus",
           role="first-token sink", threshold=0.5),
    Metric("cls", "attention to the special units at the start ([CLS], <bos>)", "corpus",
           role="[CLS]/BOS sink", threshold=0.5),
    Metric("sep", "attention to the special units at the end ([SEP], </s>, <eos>)", "corpus",
           role="[SEP]/EOS sink", threshold=0.5),
    Metric("punctuation", "attention to units made only of Unicode punctuation", "corpus",
           role="punctuation head", threshold=0.5),
    Metric("entropy", "entropy of the row, in nats", "corpus", value_range=(0.0, None), unit="nats"),
    Metric("normalized_entropy", "entropy divided by ln(visible keys): 1 is uniform", "corpus",
           role="broad head", threshold=0.8),
    Metric("max_weight", "largest weight of the row (confidence)", "corpus",
           role="confident head", threshold=0.8),
    Metric("duplicate_token", "attention to earlier copies of the query's token", "pattern",
           role="duplicate-token head", threshold=0.25, applies_to="decoders"),
    Metric("induction", "attention to the token after an earlier copy of the query's token", "pattern",
           role="induction head", threshold=0.25, applies_to="decoders"),
)

# Table order: the scores table, the CSV and every listing follow it.
METRICS: Mapping[MetricName, Metric] = MappingProxyType({m.name: m for m in _ALL})
THRESHOLDS: Mapping[MetricName, float] = MappingProxyType(
    {m.name: m.threshold for m in _ALL if m.threshold is not None})
ROLE_LABELS: Mapping[MetricName, str] = MappingProxyType({m.name: m.role for m in _ALL if m.role is not None})
