"""The head metrics, defined once: `METRICS[name]` says what a metric measures, how it is computed,
its value range, and the role a head earns by reaching its threshold.

A registry entry is its computation: `Metric.computation` is one of four kinds of row reduction,
which `analyses.heads.HeadScoreAccumulator` folds for every entry of the registry it is given,
whole maps and blocks of query rows alike:

- `Diagonal(offset)`: attention at a diagonal offset, `A[q, q + offset]`, over the queries that have
  that key (previous_token -1, self 0, next_token +1);
- `KeyShare(keys, queries)`: the share of attention on a set of keys, `Σ_{k∈S} A[q, k]`; `keys`
  marks the set from the text's units, `queries` says which query rows count for it;
- `RowStatistic(statistic, scale)`: a statistic of each row (entropy, max weight) weighted by
  `scale(visible keys)`, over the rows that see at least `min_keys` keys;
- `Pairwise(weights)`: `Σ_k A[q, k] W[q, k]` with a `[query, key]` weight `W` from the units (an image's
  patch positions: distance, neighbours), over the queries it counts;
- `Pattern(pattern)`: TransformerLens's detection-pattern score `Σ A⊙P / Σ A` on repeated random
  tokens, `pattern(token ids)` being the 0/1 pattern `P` (`analyses.induction`).

Everything else reads the registry by name: the order of the scores table and of the CSV
(`analyses.heads`), the roles and their thresholds, the figures' colour scales and labels and the
report's grids (`reports`). A new metric is one entry here (and its name in `MetricName`, the static
list of the built-in names). A registry of one's own is a mapping too, `{**METRICS, "name":
Metric("name", ...)}`, given to `HeadScoreAccumulator(metrics=...)` or `score_corpus(metrics=...)`:
nothing here is changed.

>>> [m for m, spec in METRICS.items() if spec.kind == "pattern"]
['duplicate_token', 'induction']
>>> THRESHOLDS["induction"], ROLE_LABELS["induction"]
(0.25, 'induction head')
>>> METRICS["previous_token"].computation
Diagonal(offset=-1)
"""

from __future__ import annotations

import functools
import math
import re
import unicodedata
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Callable, ClassVar, Literal, Mapping, Sequence, Union

if TYPE_CHECKING:  # annotations only: torch is imported by the functions that compute with it
    import torch

from .induction import duplicate_token_pattern, induction_pattern

__all__ = [
    "MetricName", "MetricKind", "Metric", "Computation", "Diagonal", "KeyShare", "RowStatistic", "Pattern", "Pairwise",
    "METRICS", "THRESHOLDS", "ROLE_LABELS", "VISION_METRICS", "FIGURE_HEAD_METRICS", "thresholds_of", "role_labels_of",
    "is_punctuation", "first_unit", "leading_special", "trailing_special", "punctuation_units",
    "outside_and_seeing", "row_entropy", "row_max", "unscaled", "over_log",
    "register_units", "patch_positions", "patch_distance", "previous_patch", "neighbour_patches",
    "image_tokens", "text_tokens",
]

MetricName = Literal[
    "previous_token", "next_token", "self", "first_token", "cls", "sep", "punctuation",
    "entropy", "normalized_entropy", "max_weight", "duplicate_token", "induction",
    "registers", "attention_distance", "previous_patch", "neighbour_patches", "image_share", "image_to_text",
]
# corpus: a mean over the query rows of attention maps of ordinary texts;
# pattern: TransformerLens's detection-pattern score on repeated random tokens (`analyses.induction`).
MetricKind = Literal["corpus", "pattern"]


# --- the pieces the built-in entries are made of ----------------------------------------------------


@functools.lru_cache(maxsize=1 << 16)  # a corpus repeats its words: each label's characters are read once
def is_punctuation(label: str) -> bool:
    """True when `label` (stripped) is non-empty and only Unicode punctuation (category P*).

    >>> [is_punctuation(s) for s in (".", "?!", "。", '"', "$", "a.", " ")]
    [True, True, True, True, False, False, False]
    """
    s = label.strip()
    return bool(s) and all(unicodedata.category(c).startswith("P") for c in s)


def first_unit(labels: Sequence[str], special: Sequence[bool]) -> list[bool]:
    """Position 0, whatever it is."""
    return [i == 0 for i in range(len(special))]


def leading_special(labels: Sequence[str], special: Sequence[bool]) -> list[bool]:
    """The run of special units at the start ([CLS], <bos>).

    >>> leading_special("abcd", [True, False, True, True])
    [True, False, False, False]
    """
    lead = _run_length(special)
    return [i < lead for i in range(len(special))]


def trailing_special(labels: Sequence[str], special: Sequence[bool]) -> list[bool]:
    """The run of special units at the end ([SEP], </s>, <eos>), none of the leading run.

    >>> trailing_special("abcd", [True, False, True, True]), trailing_special("ab", [True, True])
    ([False, False, True, True], [False, False])
    """
    t = len(special)
    trail = min(_run_length(special[::-1]), t - _run_length(special))
    return [i >= t - trail for i in range(t)]


def punctuation_units(labels: Sequence[str], special: Sequence[bool]) -> list[bool]:
    """Units whose label is only Unicode punctuation (`is_punctuation`), special units left out."""
    return [is_punctuation(lab) and not sp for lab, sp in zip(labels, special)]


def register_units(labels: Sequence[str], special: Sequence[bool]) -> list[bool]:
    """A vision transformer's register tokens ([REG0], [REG1], ...: Darcet et al. 2024), special units.

    >>> register_units(["[CLS]", "[REG0]", "r0c0"], [True, True, False])
    [False, True, False]
    """
    return [bool(sp) and lab.startswith("[REG") for lab, sp in zip(labels, special)]


_PATCH = re.compile(r"r(\d+)c(\d+)")


def patch_positions(labels: Sequence[str], special: Sequence[bool]) -> list[tuple[int, int] | None]:
    """(row, column) of each patch unit of an image's map, read off its labels (`r{row}c{col}`, as
    `probe.images` writes them); None for special units and for every unit of a text.

    >>> patch_positions(["[CLS]", "r0c0", "r1c2", "rc"], [True, False, False, False])
    [None, (0, 0), (1, 2), None]
    """
    return list(_positions(tuple(labels), tuple(special)))


@functools.lru_cache(maxsize=8)  # the three patch metrics read the same map's positions in turn
def _positions(labels: tuple[str, ...], special: tuple[bool, ...]) -> tuple[tuple[int, int] | None, ...]:
    out = []
    for lab, sp in zip(labels, special):
        m = None if sp or lab[:1] != "r" else _PATCH.fullmatch(lab)  # most text labels are ruled out by one test
        out.append(None if m is None else (int(m.group(1)), int(m.group(2))))
    return tuple(out)


def _pairs(labels, special, weight: Callable[[int, int, int, int], float]) -> tuple[torch.Tensor | None, list[bool]]:
    import torch
    pos = patch_positions(labels, special)
    t = len(pos)
    if all(p is None for p in pos):  # a text: no patch, no row counted, and no T × T weights to build
        return None, [False] * t
    w = torch.zeros(t, t)
    for q, pq in enumerate(pos):
        if pq is None:
            continue
        for k, pk in enumerate(pos):
            if pk is not None:
                w[q, k] = weight(pq[0] - pk[0], pq[1] - pk[1], *pq)
    return w, [p is not None for p in pos]


def patch_distance(labels: Sequence[str], special: Sequence[bool]) -> tuple[torch.Tensor, list[bool]]:
    """W[q, k]: the distance between patches q and k in patches (Euclidean; 0 for special keys), counted
    over the patch queries: Σ_k A[q, k] W[q, k] is Dosovitskiy et al.'s (2021, Fig. 7) mean attention distance.

    >>> w, counted = patch_distance(["[CLS]", "r0c0", "r0c1", "r1c1"], [True, False, False, False])
    >>> w[1].tolist(), counted
    ([0.0, 0.0, 1.0, 1.4142135381698608], [False, True, True, True])
    """
    return _pairs(labels, special, lambda dr, dc, r, c: math.hypot(dr, dc))


def previous_patch(labels: Sequence[str], special: Sequence[bool]) -> tuple[torch.Tensor, list[bool]]:
    """W[q, k] = 1 for the patch left of q in its row (the patch before it in reading order, without
    wrapping to the row above), counted over the patches that have one."""
    w, counted = _pairs(labels, special, lambda dr, dc, r, c: float(dr == 0 and dc == 1))
    return w, counted if w is None else [bool(row.any()) for row in w]


def neighbour_patches(labels: Sequence[str], special: Sequence[bool]) -> tuple[torch.Tensor, list[bool]]:
    """W[q, k] = 1 for the (up to 8) patches around q, counted over the patch queries: a local, convolution-like head.

    >>> w, counted = neighbour_patches(["r0c0", "r0c1", "r1c0", "r1c1"], [False] * 4)
    >>> w[0].tolist()
    [0.0, 1.0, 1.0, 1.0]
    """
    return _pairs(labels, special, lambda dr, dc, r, c: float(max(abs(dr), abs(dc)) == 1))


def image_tokens(labels: Sequence[str], special: Sequence[bool], *,
                 patches: Sequence[object | None] = ()) -> list[bool]:
    """A vision–language text's image tokens: the units that carry an `ImagePatch` (`AttentionMap.patches`).

    >>> image_tokens(["<s>", "<image>", "cat"], [True, True, False], patches=[None, "cell", None])
    [False, True, False]
    """
    return [p is not None for p in patches] if len(patches) else [False] * len(labels)


def text_tokens(labels: Sequence[str], special: Sequence[bool], *,
                patches: Sequence[object | None] = ()) -> list[bool]:
    """The other units of a vision–language text (text tokens, special ones included); none for a text without
    images, so that image-to-text attention counts no row there.

    >>> text_tokens(["<s>", "<image>", "cat"], [True, True, False], patches=[None, "cell", None])
    [True, False, True]
    >>> text_tokens(["a", "b"], [False, False])
    [False, False]
    """
    image = image_tokens(labels, special, patches=patches)
    return [not x for x in image] if any(image) else [False] * len(labels)


def outside_and_seeing(member: Sequence[bool], *, causal: bool) -> list[bool]:
    """The queries counted for a key set: outside it (a sink attending to itself is `self`) and able to
    see one of its keys (a causal query from the set's first key on). A set with no key counts none.

    >>> outside_and_seeing([False, True, False, True], causal=True)
    [False, False, True, False]
    """
    member = list(member)
    t = len(member)
    start = member.index(True) if True in member else t  # the set's first key
    if start == t:
        return [False] * t
    first = start if causal else 0  # a causal query sees the set from its first key on
    return [False] * first + [not m for m in member[first:]]


_ENTROPY_CHUNK = 1 << 18  # elements of `a` per step of `row_entropy` (1 MB of float32: stays in cache)


def row_entropy(a: torch.Tensor) -> torch.Tensor:
    """`-Σ_k A[q, k] ln A[q, k]` per row, in nats: `[..., row, key]` -> `[..., row]`.

    >>> import torch
    >>> row_entropy(torch.tensor([[0.5, 0.5, 0.0], [1.0, 0.0, 0.0]]))
    tensor([0.6931, -0.0000])
    """
    import torch
    # 0·ln(tiny) = 0 stands in for 0·ln 0 (masked keys); twice as fast as torch.special.xlogy on CPU.
    # One buffer, logged and multiplied in place: the same values as a * log(a) bit for bit, one pass fewer.
    # A large `a` (a block of rows) goes a few rows at a time through one small buffer: each row's four passes
    # (clamp, log, product, sum) stay in cache and no `a`-sized buffer is made (its pages cost a pass of their
    # own); each row's sum is the same computation, so the values are the same bit for bit.
    tiny = torch.finfo(a.dtype).tiny
    k = a.shape[-1]
    if a.numel() <= _ENTROPY_CHUNK or k == 0 or a.stride(-1) != 1:
        return -a.clamp_min(tiny).log_().mul_(a).sum(-1)
    try:
        rows = a.view(-1, k)  # evenly spaced rows (a block's band)
    except RuntimeError:  # rows of a view that are not: one leading index at a time, never a copy
        return torch.stack([row_entropy(part) for part in a.unbind(0)])
    step = max(1, _ENTROPY_CHUNK // k)
    out = rows.new_empty(rows.shape[0])
    buf = rows.new_empty(min(step, rows.shape[0]), k)
    for start in range(0, rows.shape[0], step):
        part = rows[start : start + step]
        torch.clamp_min(part, tiny, out=buf[: len(part)]).log_().mul_(part)
        torch.sum(buf[: len(part)], -1, out=out[start : start + len(part)])
    return out.neg_().view(a.shape[:-1])


def row_max(a: torch.Tensor) -> torch.Tensor:
    """`max_k A[q, k]` per row: `[..., row, key]` -> `[..., row]`."""
    return a.amax(-1)


def unscaled(visible: int) -> float:
    """Every counted row weighs 1."""
    return 1.0


def over_log(visible: int) -> float:
    """`1 / ln(visible keys)`: the row's entropy relative to the uniform row's (only for >= 2 keys)."""
    return 1 / math.log(visible)


def _run_length(flags: Sequence[bool]) -> int:
    n = 0
    for f in flags:
        if not f:
            break
        n += 1
    return n


# --- the four kinds of computation ----------------------------------------------------------------


@dataclass(frozen=True)
class Diagonal:
    """Attention at a diagonal offset, `A[q, q + offset]`, averaged over the queries that have that key
    (`T - |offset|` of a text's `T`)."""

    offset: int
    kind: ClassVar[MetricKind] = "corpus"


@dataclass(frozen=True)
class KeyShare:
    """The attention on a set of keys, `Σ_{k∈S} A[q, k]`, averaged over the query rows that count for it.

    `keys(labels, special)` marks the set's keys (one bool per unit) from the labels and special flags
    of the units a text is scored on (with `include_special=False` its special units are already
    removed, so none is special); with `patches=True` it is `keys(labels, special, patches=...)`, also
    given each unit's `ImagePatch` or None (a vision–language text's image tokens; all None for a text
    without images); `queries(member, causal=...)` marks the queries counted for it.
    """

    keys: Callable[..., Sequence[bool]]
    queries: Callable[..., Sequence[bool]] = outside_and_seeing
    patches: bool = False  # keys(labels, special, patches=...) also reads the units' image cells (`ImagePatch`)
    kind: ClassVar[MetricKind] = "corpus"


@dataclass(frozen=True)
class RowStatistic:
    """A statistic of each query row, `statistic(a[..., row, key]) -> [..., row]`, weighted per row by
    `scale(visible keys)`; rows that see fewer than `min_keys` keys are left out (weight 0, not counted).

    Metrics of one registry that share a `statistic` (the same function) share its computation: it runs
    once per block, and one matmul weights it for all of them. `zeros_free`: the statistic of a row is
    the same with its exact-zero keys left out (entropy, max weight), so a block of causal rows hands it
    only the keys its rows can see (`probe.blocks.Block.band`); False (the safe default) gives it
    every key.
    """

    statistic: Callable[[torch.Tensor], torch.Tensor]
    scale: Callable[[int], float] = unscaled
    min_keys: int = 2
    zeros_free: bool = False
    kind: ClassVar[MetricKind] = "corpus"

    def weight(self, visible: int) -> float:
        """The weight of a row that sees `visible` keys."""
        return self.scale(visible) if visible >= self.min_keys else 0.0


@dataclass(frozen=True)
class Pattern:
    """TransformerLens's detection-pattern score `Σ A⊙P / Σ A` of one repeated random sequence, averaged
    over sequences: `pattern(ids)` is the 0/1 `[query, key]` pattern of the token ids (a 1-d long tensor)."""

    pattern: Callable[[torch.Tensor], torch.Tensor]
    kind: ClassVar[MetricKind] = "pattern"


@dataclass(frozen=True)
class Pairwise:
    """`Σ_k A[q, k] W[q, k]` per query row, averaged over the rows it counts: `weights(labels, special)`
    gives the `[query, key]` weights `W` and the counted queries from the units (an image's patch grid);
    a map whose units give no counted query (a text) contributes no row, and its `W` may be None (no
    T × T weights are built, and its attention is not read for this metric)."""

    weights: Callable[[Sequence[str], Sequence[bool]], tuple[torch.Tensor | None, Sequence[bool]]]
    kind: ClassVar[MetricKind] = "corpus"


Computation = Union[Diagonal, KeyShare, RowStatistic, Pattern, Pairwise]


# --- the registry -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Metric:
    """One head metric and what computes it. `value_range` is the colour scale; an upper bound of None
    means "up to the largest value drawn" (entropy has no fixed maximum). `threshold` is the score at
    which a head gets `role` (both None when the metric names no role). `applies_to="encoders"`: a
    corpus metric that counts no row of causal attention (NaN, n = 0 for a decoder)."""

    name: str  # a built-in's is a MetricName
    measures: str
    computation: Computation
    value_range: tuple[float, float | None] = (0.0, 1.0)
    unit: str = ""
    role: str | None = None
    threshold: float | None = None
    applies_to: Literal["all", "encoders", "decoders", "images", "vision_language"] = "all"

    @property
    def kind(self) -> MetricKind:
        """"corpus" (a mean over the query rows of texts) or "pattern" (repeated random tokens)."""
        return self.computation.kind

    @property
    def label(self) -> str:
        """The name as words, for titles and captions: "previous token"."""
        return self.name.replace("_", " ")


# Thresholds: 0.5 for attention shares is Clark et al.'s "more than half of its attention" (previous/next
# token heads, [SEP] heads). A perfect induction or duplicate-token head scores about 0.5 under
# TransformerLens's definition (the first copy has nothing to match), so 0.25 means about half its
# attention in the second copy goes to the target.
_ALL = (
    Metric("previous_token", "attention to the previous unit, A[q, q-1]", Diagonal(-1),
           role="previous-token head", threshold=0.5),
    Metric("next_token", "attention to the next unit, A[q, q+1] (none under a causal mask)", Diagonal(+1),
           role="next-token head", threshold=0.5, applies_to="encoders"),
    Metric("self", "attention to the query's own unit, A[q, q]", Diagonal(0),
           role="self (current-token) head", threshold=0.5),
    Metric("first_token", "attention to position 0, whatever it is", KeyShare(first_unit),
           role="first-token sink", threshold=0.5),
    Metric("cls", "attention to the special units at the start ([CLS], <bos>)", KeyShare(leading_special),
           role="[CLS]/BOS sink", threshold=0.5),
    Metric("sep", "attention to the special units at the end ([SEP], </s>, <eos>)", KeyShare(trailing_special),
           role="[SEP]/EOS sink", threshold=0.5),
    Metric("punctuation", "attention to units made only of Unicode punctuation", KeyShare(punctuation_units),
           role="punctuation head", threshold=0.5),
    Metric("entropy", "entropy of the row, in nats", RowStatistic(row_entropy, zeros_free=True),
           value_range=(0.0, None), unit="nats"),
    Metric("normalized_entropy", "entropy divided by ln(visible keys): 1 is uniform", RowStatistic(row_entropy, over_log, zeros_free=True),
           role="broad head", threshold=0.8),
    Metric("max_weight", "largest weight of the row (confidence)", RowStatistic(row_max, zeros_free=True),
           role="confident head", threshold=0.8),
    Metric("duplicate_token", "attention to earlier copies of the query's token", Pattern(duplicate_token_pattern),
           role="duplicate-token head", threshold=0.25, applies_to="decoders"),
    Metric("induction", "attention to the token after an earlier copy of the query's token", Pattern(induction_pattern),
           role="induction head", threshold=0.25, applies_to="decoders"),
    # Vision transformers (images): positions are read off the map's patch units; a text counts no row.
    Metric("registers", "attention to the register tokens ([REG0], ...; the vision sink of Darcet et al. 2024)",
           KeyShare(register_units), role="register sink", threshold=0.5, applies_to="images"),
    Metric("attention_distance", "mean distance from the query patch to the patches it attends to, in patches "
           "(Dosovitskiy et al. 2021, Fig. 7)", Pairwise(patch_distance), value_range=(0.0, None), unit="patches",
           applies_to="images"),
    Metric("previous_patch", "attention to the patch on the left, in the query's row", Pairwise(previous_patch),
           role="previous-patch head", threshold=0.5, applies_to="images"),
    Metric("neighbour_patches", "attention to the (up to 8) patches around the query patch", Pairwise(neighbour_patches),
           role="local (neighbour-patch) head", threshold=0.5, applies_to="images"),
    # Vision–language decoders: image tokens are the units with an ImagePatch; a map without one counts no row.
    Metric("image_share", "share of the text queries' attention on image tokens (the queries that see one)",
           KeyShare(image_tokens, patches=True), role="image-reading head", threshold=0.5,
           applies_to="vision_language"),
    Metric("image_to_text", "share of the image tokens' attention on text tokens (those they see: earlier text "
           "under a causal mask, the whole prefix under a prefix-LM's)", KeyShare(text_tokens, patches=True),
           applies_to="vision_language"),
)


def thresholds_of(metrics: Mapping[str, Metric]) -> dict[str, float]:
    """The role thresholds of a registry, in its order."""
    return {name: m.threshold for name, m in metrics.items() if m.threshold is not None}


def role_labels_of(metrics: Mapping[str, Metric]) -> dict[str, str]:
    """The role each metric of a registry names, in its order."""
    return {name: m.role for name, m in metrics.items() if m.role is not None}


# Table order: the scores table, the CSV and every listing follow it.
METRICS: Mapping[MetricName, Metric] = MappingProxyType({m.name: m for m in _ALL})
THRESHOLDS: Mapping[MetricName, float] = MappingProxyType(thresholds_of(METRICS))
ROLE_LABELS: Mapping[MetricName, str] = MappingProxyType(role_labels_of(METRICS))
# The metrics a vision transformer's heads are summarised by (the report's Vision section): the [CLS] sink and every
# metric that applies to images only.
VISION_METRICS: tuple[MetricName, ...] = ("cls", *(m.name for m in _ALL if m.applies_to == "images"))
# The head the report's attention figures show when no probe chose one: the top head of the first of these that was
# scored (a previous-token head is the easiest pattern to read; any model has a most confident head).
FIGURE_HEAD_METRICS: tuple[MetricName, ...] = ("previous_token", "max_weight")
