"""Do heads follow dependency relations? Per-sentence facts, one example per arc, per-relation scores.

Everything here works on word-level attention already extracted (`probe.extract(..., level="word",
segmenter=...)` with the gold words as segments) and on gold `treebank.Sentence`s; no model.

1. `summarise(amap, sentence)` -> `SentenceAttention`: for every head, the word each word attends
   to most (special tokens and the word itself excluded; an exact tie is no pick), and, for the heads
   kept, the word-to-word scores used to decode trees (`analyses.syntax.trees`).
2. `collect_arcs` -> `Arcs`: one example per gold arc and direction, with each head's outcome.
   *dependent->head*: the dependent is the query and its governor the answer (Clark et al. 2019).
   *head->dependent*: the governor is the query; one example per (governor, relation), right when the
   most-attended word is any of its dependents with that relation.
3. `score_relations`: per relation and direction, the head with the most right answers on the
   selection sentences (ties by the seeded rank of `analyses.selection`) is scored on the test
   sentences (Wilson interval). The baseline is the best fixed relative offset for that relation
   and direction, chosen on the selection sentences too.
   `p_value` is a one-sided paired sign-flip test of head vs offset on the test examples (valid as
   is: nothing was chosen on them); `p_holm` adjusts it for the number of relations tested.

Decoders are causal: a query sees only earlier words, so an answer after it cannot be attended to.
Those examples are kept (the table compares models on the same arcs) and counted in `n_after`.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Literal, Sequence

import numpy as np
import pandas as pd
import torch

from headscope.probe.types import AttentionMap

from ..selection import beats_baseline, chosen_head, head_rank, heldout_score, no_head_beats, select_head, too_few
from ..stats import format_p, holm, signflip_max_p, wilson
from ..treebank import Sentence
from .trees import decode_tree, undirected_matches

__all__ = ["Direction", "DIRECTIONS", "ALL_RELATIONS", "MIN_EXAMPLES", "NOT_IN_MAP", "SHARED_UNIT", "SentenceAttention",
           "Arcs", "RelationScore", "unit_of_words", "top_units", "word_scores", "summarise", "collect_arcs",
           "best_offset", "score_relations"]

Direction = Literal["dependent->head", "head->dependent"]
DIRECTIONS: tuple[Direction, ...] = ("dependent->head", "head->dependent")
ALL_RELATIONS = "all"  # every arc pooled, as Clark et al.'s "all relations" row
MIN_EXAMPLES = 20  # below this many examples on either split no head is crowned
NOT_IN_MAP = "a word of the arc is not in the model's map"
SHARED_UNIT = "both words of the arc fall in one model unit"


# --------------------------------------------------------------------------------------------
# 1. From a word-level map to per-sentence facts


def unit_of_words(amap: AttentionMap, sentence: Sentence) -> tuple[int, ...]:
    """The map unit holding each gold word (the unit whose span holds the word's first character; -1 if none).

    >>> s = Sentence(id="1", text="ab c", forms=("ab", "c"), heads=(-1, 0), deprels=("root", "dep"),
    ...              segment=(0, 1), segments=((0, 2), (3, 4)))
    >>> m = AttentionMap(text="ab c", level="word", labels=("[CLS]", "ab c"), spans=((0, 0), (0, 4)),
    ...                  special=(True, False), attention=torch.zeros(1, 1, 2, 2), causal=False)
    >>> unit_of_words(m, s)
    (1, 1)
    """
    units = [(a, b, u) for u, ((a, b), sp) in enumerate(zip(amap.spans, amap.special)) if not sp]
    of_segment = []
    for start, _ in sentence.segments:
        of_segment.append(next((u for a, b, u in units if a <= start < b), -1))
    return tuple(of_segment[k] for k in sentence.segment)


def top_units(attention: torch.Tensor, special: Sequence[bool]) -> torch.Tensor:
    """The unit each query attends to most, `[layer, head, query]`: special units and the query itself
    excluded; -1 where the two largest are equal (an exact tie, e.g. a decoder's first word) or no unit is left.

    >>> a = torch.tensor([[[[0.5, 0.3, 0.2], [0.6, 0.1, 0.3], [0.9, 0.05, 0.05]], [[0.2, 0.4, 0.4]] * 3]])
    >>> top_units(a, [True, False, False])   # unit 0 is special; head 1 ties between units 1 and 2 for query 0
    tensor([[[ 1,  2,  1],
             [-1,  2,  1]]])
    """
    n = attention.shape[-1]
    excluded = torch.eye(n, dtype=torch.bool) | torch.tensor(list(special), dtype=torch.bool)[None, :]  # [query, key]
    a = attention.float().masked_fill(excluded, -torch.inf)  # a new tensor: the caller's stays as it was
    if n < 2:
        return torch.full(a.shape[:-1], -1, dtype=torch.long)
    top = a.topk(2, dim=-1)
    pick = top.indices[..., 0]
    clear = (top.values[..., 0] > top.values[..., 1]) & torch.isfinite(top.values[..., 0])
    return torch.where(clear, pick, torch.full_like(pick, -1))


def word_scores(attention: torch.Tensor, units: Sequence[int]) -> torch.Tensor:
    """Word-to-word scores for tree decoding, `[head, dependent, governor]` from `[head, query, key]` units.

    Row d is how much word d attends to each other word, renormalised over the other words: special
    tokens (an attention sink for many heads), the word itself, words in its own unit and words
    missing from the map get 0, so only the choice among the other words counts.

    >>> a = torch.tensor([[[0.2, 0.4, 0.4], [0.5, 0.25, 0.25], [0.1, 0.1, 0.8]]])   # units: [CLS], w0, w1
    >>> word_scores(a, [1, 2])
    tensor([[[0., 1.],
             [1., 0.]]])
    """
    idx = torch.tensor(list(units), dtype=torch.long)
    safe = idx.clamp(min=0)
    a = attention.float().index_select(-2, safe).index_select(-1, safe)  # [head, word, word]
    invalid = (idx[:, None] == idx[None, :]) | (idx[:, None] < 0) | (idx[None, :] < 0)
    a = a.masked_fill(invalid, 0.0)
    return a / a.sum(-1, keepdim=True).clamp_min(torch.finfo(torch.float32).tiny)


@dataclass(frozen=True, eq=False)
class SentenceAttention:
    """What the syntax analyses keep of one sentence's word-level map.

    `top[layer, head, unit]` is the unit each unit attends to most (`top_units`); `units[word]` the
    unit of each gold word; `scores[k, dependent, governor]` the tree scores (`word_scores`) of the
    heads listed in `kept` (flat indices `layer_pos * n_heads + head_pos`), or None;
    `tree_matches[flat head]` how many gold arcs each head's decoded tree has, or None.
    """

    sentence: Sentence
    units: tuple[int, ...]
    top: torch.Tensor  # [layer, head, unit]
    scores: torch.Tensor | None = None  # [kept head, dependent, governor]
    kept: tuple[int, ...] = ()
    tree_matches: np.ndarray | None = None  # [layer * head]


def summarise(amap: AttentionMap, sentence: Sentence, *, keep: Sequence[int] = (),
              match_trees: bool = False) -> SentenceAttention:
    """`SentenceAttention` of a word-level map: `keep` lists the flat heads whose tree scores to keep;
    `match_trees` decodes every head's tree now and keeps only how many gold arcs it matches."""
    if amap.level != "word":
        raise ValueError("summarise needs a word-level map (extract with level='word')")
    units = unit_of_words(amap, sentence)
    top = top_units(amap.attention, amap.special).to(torch.int32)
    n_heads = amap.n_layers * amap.n_heads
    flat = amap.attention.reshape(n_heads, len(amap), len(amap))  # [layer * head, query, key]
    kept = tuple(int(k) for k in keep)
    scores = word_scores(flat[list(kept)], units).to(torch.float16) if kept else None
    matches = None
    if match_trees:
        every = word_scores(flat, units).numpy()  # [layer * head, dependent, governor]
        matches = np.array([undirected_matches(decode_tree(sc, sentence.root), sentence.heads) for sc in every])
    return SentenceAttention(sentence=sentence, units=units, top=top, scores=scores, kept=kept, tree_matches=matches)


# --------------------------------------------------------------------------------------------
# 2. Arcs and each head's outcome on them


@dataclass(frozen=True, eq=False)
class Arcs:
    """One example per gold arc and direction (see the module docstring), over a set of sentences.

    `offsets[i]` are the answers' positions relative to the query (word index differences), so any
    fixed-offset baseline is scored without the sentences; `correct[example, layer, head]`.
    """

    relation: np.ndarray  # [example] str
    direction: np.ndarray  # [example] str
    offsets: tuple[frozenset, ...]
    after: np.ndarray  # [example] bool: every answer lies after the query
    correct: torch.Tensor  # [example, layer, head] bool
    sentence: np.ndarray  # [example] index of the sentence in the input
    excluded: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.offsets)

    def where(self, relation: str, direction: str) -> np.ndarray:
        """Indices of the examples of one relation (`ALL_RELATIONS`: every relation) and direction."""
        hit = self.direction == direction
        if relation != ALL_RELATIONS:
            hit &= self.relation == relation
        return np.nonzero(hit)[0]


def _queries(sentence: Sentence, subtypes: bool) -> list[tuple[str, str, int, tuple[int, ...]]]:
    """(relation, direction, query word, answer words) for every example of one sentence."""
    out = []
    groups: dict[tuple[int, str], list[int]] = {}
    for d, g, rel in sentence.arcs(subtypes=subtypes):
        out.append((rel, DIRECTIONS[0], d, (g,)))
        groups.setdefault((g, rel), []).append(d)
    out += [(rel, DIRECTIONS[1], g, tuple(ds)) for (g, rel), ds in groups.items()]
    return out


def collect_arcs(records: Sequence[SentenceAttention], *, subtypes: bool = False) -> Arcs:
    """Every example of every sentence, with each head's outcome; unscorable arcs are counted, not fatal."""
    rel, direc, offs, after, rows, sent = [], [], [], [], [], []
    excluded: Counter = Counter()
    shape = None
    for i, rec in enumerate(records):
        shape = rec.top.shape[:2]
        for relation, direction, q, answers in _queries(rec.sentence, subtypes):
            qu, aus = rec.units[q], [rec.units[a] for a in answers]
            if qu < 0 or min(aus) < 0:
                excluded[NOT_IN_MAP] += 1
                continue
            if qu in aus:
                excluded[SHARED_UNIT] += 1
                continue
            picks = rec.top[:, :, qu].long()  # [layer, head]
            rows.append((picks[..., None] == torch.tensor(aus)).any(-1))
            rel.append(relation)
            direc.append(direction)
            offs.append(frozenset(a - q for a in answers))
            after.append(min(answers) > q)
            sent.append(i)
    correct = torch.stack(rows) if rows else torch.zeros(0, *(shape or (1, 1)), dtype=torch.bool)
    return Arcs(relation=np.array(rel, dtype=object), direction=np.array(direc, dtype=object), offsets=tuple(offs),
                after=np.array(after, dtype=bool), correct=correct, sentence=np.array(sent, dtype=np.int64),
                excluded=dict(excluded))


# --------------------------------------------------------------------------------------------
# 3. Per-relation scores


def best_offset(offsets: Sequence[frozenset]) -> int | None:
    """The relative offset right on the most examples; ties go to the nearer, then the leftward one.

    >>> best_offset([frozenset({-1}), frozenset({-1, 2}), frozenset({2}), frozenset({1})])
    -1
    """
    counts = Counter(o for s in offsets for o in s)
    if not counts:
        return None
    return max(counts, key=lambda o: (counts[o], -abs(o), o < 0))


@dataclass(frozen=True)
class RelationScore:
    """One relation in one direction: the head chosen on the selection split, scored on the test split."""

    relation: str
    direction: str
    n: int  # test examples
    n_select: int
    best_head: tuple[int, int] | None  # model (layer, head)
    heldout_correct: int
    heldout_accuracy: float | None
    ci95: tuple[float, float] | None
    baseline_offset: int | None
    baseline_correct: int
    baseline_accuracy: float | None
    p_value: float | None
    p_holm: float | None
    beats_baseline: bool
    verdict: str
    n_after: int = 0

    def to_dict(self) -> dict:
        return {
            "relation": self.relation,
            "direction": self.direction,
            "n": self.n,
            "best_head": None if self.best_head is None else {"layer": self.best_head[0], "head": self.best_head[1]},
            "heldout_accuracy": self.heldout_accuracy,
            "ci95": None if self.ci95 is None else list(self.ci95),
            "baseline_offset": self.baseline_offset,
            "baseline_accuracy": self.baseline_accuracy,
            "p_value": self.p_value,
            "verdict": self.verdict,
            "n_select": self.n_select,
            "heldout_correct": self.heldout_correct,
            "baseline_correct": self.baseline_correct,
            "p_holm": self.p_holm,
            "beats_baseline": self.beats_baseline,
            "n_after": self.n_after,
        }


def _keys(select: Arcs, test: Arcs) -> list[tuple[str, str]]:
    """(relation, direction) in a fixed order: per direction, all relations pooled, then by test frequency."""
    keys = []
    for direction in DIRECTIONS:
        count = Counter(r for r, d in zip(test.relation, test.direction) if d == direction)
        count.update({r: 0 for r, d in zip(select.relation, select.direction) if d == direction})
        keys.append((ALL_RELATIONS, direction))
        keys += [(r, direction) for r in sorted(count, key=lambda r: (-count[r], r))]
    return keys


def _offset_hits(offsets: Sequence[frozenset], offset: int | None) -> np.ndarray:
    return np.array([offset is not None and offset in s for s in offsets], dtype=bool)


def _one_relation(select: Arcs, test: Arcs, relation: str, direction: str, ids: tuple, rank: torch.Tensor,
                  *, n_perm: int, seed: int, min_examples: int) -> tuple[dict, np.ndarray, np.ndarray]:
    """Fields of a `RelationScore` (without Holm and verdict) and the per-head correct counts of both splits."""
    s_idx, t_idx = select.where(relation, direction), test.where(relation, direction)
    s_correct, t_correct = select.correct[s_idx], test.correct[t_idx]  # [example, layer, head]
    s_counts, t_counts = s_correct.sum(0).numpy(), t_correct.sum(0).numpy()
    offset = best_offset([select.offsets[i] for i in s_idx])
    base = _offset_hits([test.offsets[i] for i in t_idx], offset)
    n, n_sel = len(t_idx), len(s_idx)
    fields = dict(relation=relation, direction=direction, n=n, n_select=n_sel, baseline_offset=offset,
                  baseline_correct=int(base.sum()), baseline_accuracy=float(base.mean()) if n and offset is not None else None,
                  n_after=int(test.after[t_idx].sum()), best_head=None, heldout_correct=0, heldout_accuracy=None,
                  ci95=None, p_value=None)
    if n < min_examples or n_sel < min_examples:
        return fields, s_counts, t_counts
    li, hi = select_head(s_correct, rank)
    outcome = t_correct[:, li, hi].numpy()
    c = int(outcome.sum())
    diff = outcome.astype(np.float64) - base.astype(np.float64)
    fields.update(best_head=(ids[0][li], ids[1][hi]), heldout_correct=c, heldout_accuracy=c / n, ci95=wilson(c, n),
                  p_value=signflip_max_p(diff, n_perm=n_perm, seed=seed))
    return fields, s_counts, t_counts


def _verdict(f: dict, p_holm: float | None, n_tests: int, beats: bool, min_examples: int) -> str:
    name = f"{f['relation']} ({f['direction']})"
    if f["best_head"] is None:
        return f"{name}: " + too_few(f" ({f['n_select']} for selection, {f['n']} for test; at least {min_examples} "
                                     f"needed on each)")
    n, c, lo, hi = f["n"], f["heldout_correct"], *f["ci95"]
    off = f["baseline_offset"]
    base = f"the best fixed offset ({off:+d}, chosen on the selection split)" if off is not None else "no offset"
    tests = f"{format_p(f['p_value'])}, Holm-adjusted over {n_tests} tests {format_p(p_holm)}"
    did = (f"{chosen_head(f['best_head'], None, on='the selection split')} finds the answer for "
           f"{heldout_score(c, n, (lo, hi), 'examples')}")
    if beats:
        return f"{name}: {did}, above {base} at {f['baseline_correct']}/{n} ({tests})."
    return f"{name}: " + no_head_beats(did, base, f"{f['baseline_correct']}/{n}", tests, against="offset baseline")


def score_relations(select: Arcs, test: Arcs, layer_ids: Sequence[int], head_ids: Sequence[int], *,
                    n_perm: int = 10_000, seed: int = 0, alpha: float = 0.05,
                    min_examples: int = MIN_EXAMPLES) -> tuple[list[RelationScore], pd.DataFrame]:
    """Per relation and direction: `RelationScore`s and the tidy per-head table (one row per relation x
    direction x head: correct counts and accuracy on both splits, the test Wilson interval, the chosen head)."""
    ids = (tuple(layer_ids), tuple(head_ids))
    rank = head_rank(len(ids[0]), len(ids[1]), seed=seed)
    keys = _keys(select, test)
    parts = [_one_relation(select, test, r, d, ids, rank, n_perm=n_perm, seed=seed, min_examples=min_examples)
             for r, d in keys]
    adjusted = holm([f["p_value"] for f, _, _ in parts])
    n_tests = sum(p is not None for p in adjusted)
    scores = []
    for (f, _, _), p_h in zip(parts, adjusted):
        beats = beats_baseline(p_h, f["heldout_correct"], f["baseline_correct"], alpha=alpha)
        scores.append(RelationScore(**f, p_holm=p_h, beats_baseline=beats,
                                    verdict=_verdict(f, p_h, n_tests, beats, min_examples)))
    return scores, _head_table(parts, scores, ids)


def _head_table(parts, scores: list[RelationScore], ids) -> pd.DataFrame:
    layer_grid, head_grid = np.meshgrid(np.array(ids[0]), np.array(ids[1]), indexing="ij")
    frames = []
    for (f, s_counts, t_counts), score in zip(parts, scores):
        n, n_sel = f["n"], f["n_select"]
        ci = [wilson(int(k), n) if n else (math.nan, math.nan) for k in t_counts.ravel()]
        frames.append(pd.DataFrame({
            "relation": f["relation"], "direction": f["direction"],
            "layer": layer_grid.ravel(), "head": head_grid.ravel(),
            "n_select": n_sel, "select_correct": s_counts.ravel().astype(int),
            "select_accuracy": s_counts.ravel() / n_sel if n_sel else math.nan,
            "n": n, "correct": t_counts.ravel().astype(int),
            "accuracy": t_counts.ravel() / n if n else math.nan,
            "ci_low": [lo for lo, _ in ci], "ci_high": [hi for _, hi in ci],
            "chosen": [score.best_head == (int(l), int(h)) for l, h in zip(layer_grid.ravel(), head_grid.ravel())],
        }))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
