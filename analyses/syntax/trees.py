"""Do heads' attentions make dependency trees? (Htut et al. 2019)

Each head's word-to-word scores (`analyses.syntax.relations.word_scores`) are decoded into a maximum
spanning arborescence (Chu-Liu/Edmonds) rooted at the gold root; the undirected unlabeled attachment
score (UUAS) of the head chosen on the selection sentences is set against a right-branching chain and
the best offset tree. No model: scores and gold `treebank.Sentence`s only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol, Sequence

import numpy as np
import torch

from ..selection import beats_baseline, chosen_head
from ..stats import format_p, ranked_argmax, signflip_max_p
from ..treebank import Sentence

__all__ = ["TreeRecord", "TreeSelection", "TreeScore", "decode_tree", "undirected_matches", "right_branching",
           "offset_tree", "choose_tree_head", "score_trees"]


class TreeRecord(Protocol):
    """What tree scoring reads of one sentence's summary (`analyses.syntax.relations.SentenceAttention`)."""

    sentence: Sentence
    scores: torch.Tensor | None  # [kept head, dependent, governor]
    kept: tuple[int, ...]
    tree_matches: np.ndarray | None  # [layer * head]


def decode_tree(scores: np.ndarray, root: int) -> list[int]:
    """The governor of each word (-1 for `root`) in the maximum spanning arborescence of
    `scores[dependent, governor]`, rooted at `root` (Chu-Liu/Edmonds).

    The decoder is UFAL's binding of TurboParser's implementation (`ufal.chu_liu_edmonds`): it finds
    the same optimum as networkx's `maximum_spanning_arborescence` (the tests check this on random
    matrices) in about a thousandth of the time, which is what makes decoding every head's tree on
    thousands of sentences possible. Node 0 of its matrix is an artificial root that only `root`
    may attach to.

    >>> s = np.array([[0, .9, .1], [.2, 0, .8], [.5, .5, 0]])
    >>> decode_tree(s, root=2)
    [1, 2, -1]
    """
    from ufal.chu_liu_edmonds import chu_liu_edmonds

    n = scores.shape[0]
    if n == 1:
        return [-1]
    m = np.full((n + 1, n + 1), np.nan)  # [dependent, governor]; NaN = no such arc
    m[1:, 1:] = scores
    np.fill_diagonal(m, np.nan)
    m[root + 1, 0] = 0.0
    heads, _ = chu_liu_edmonds(m)
    return [h - 1 for h in heads[1:]]


def _edges(heads: Sequence[int]) -> set[frozenset]:
    return {frozenset((d, g)) for d, g in enumerate(heads) if g >= 0}


def undirected_matches(predicted: Sequence[int], gold: Sequence[int]) -> int:
    """How many gold arcs the prediction has, direction ignored (the numerator of UUAS).

    >>> undirected_matches([1, -1, 1], [-1, 0, 1])
    2
    """
    return len(_edges(predicted) & _edges(gold))


def right_branching(n: int) -> list[int]:
    """Each word governs the next (a chain; undirected, the same as left-branching).

    >>> right_branching(3)
    [-1, 0, 1]
    """
    return [i - 1 for i in range(n)]


def offset_tree(n: int, root: int, offset: int) -> list[int]:
    """Each word but the root attached to the word `offset` away (-1 where that is outside the sentence).

    >>> offset_tree(4, root=1, offset=1)
    [1, -1, 3, -1]
    """
    return [-1 if d == root or not 0 <= d + offset < n else d + offset for d in range(n)]


@dataclass(frozen=True)
class TreeSelection:
    """The head whose decoded trees match the most gold arcs on a (seeded) sample of selection sentences."""

    head: int  # flat index layer_pos * n_heads + head_pos
    matches: np.ndarray  # [flat head] gold arcs matched
    n_edges: int
    n_sentences: int

    @property
    def uuas(self) -> float:
        return float(self.matches[self.head]) / self.n_edges if self.n_edges else math.nan


def choose_tree_head(records: Sequence[TreeRecord], rank: torch.Tensor) -> TreeSelection:
    """The head whose decoded trees match the most gold arcs over the records that carry
    `tree_matches` (`summarise(..., match_trees=True)`); ties by `rank`, as for relations."""
    used = [r for r in records if r.tree_matches is not None]
    if not used:
        raise ValueError("no sentence carries decoded trees (summarise with match_trees=True)")
    matches = np.sum([r.tree_matches for r in used], axis=0).astype(np.int64)
    edges = sum(len(r.sentence) - 1 for r in used)
    best = int(ranked_argmax(matches, rank.numpy()))
    return TreeSelection(head=best, matches=matches, n_edges=edges, n_sentences=len(used))


@dataclass(frozen=True)
class TreeScore:
    """UUAS of the chosen head's decoded trees on the test sentences, beside the baselines."""

    best_head: tuple[int, int]
    uuas: float
    right_branching_uuas: float
    offset: int | None
    offset_uuas: float
    baseline: str  # the stronger baseline on the test sentences, which `p_value` compares with
    p_value: float
    n_sentences: int
    n_edges: int
    select_uuas: float
    select_sentences: int
    verdict: str
    example: Sentence | None = None  # one test sentence, for the figure of its decoded tree
    example_heads: tuple[int, ...] = ()

    def to_dict(self) -> dict:
        return {
            "best_head": {"layer": self.best_head[0], "head": self.best_head[1]},
            "uuas": self.uuas,
            "right_branching_uuas": self.right_branching_uuas,
            "offset_uuas": self.offset_uuas,
            "p_value": self.p_value,
            "offset": self.offset,
            "baseline": self.baseline,
            "n_sentences": self.n_sentences,
            "n_edges": self.n_edges,
            "select_uuas": self.select_uuas,
            "select_sentences": self.select_sentences,
            "verdict": self.verdict,
        }


def _pick_example(records: Sequence[TreeRecord]) -> int:
    # The first test sentence of a readable length (short sentences are often fragments).
    return next((i for i, r in enumerate(records) if 8 <= len(r.sentence) <= 16), 0)


def score_trees(records: Sequence[TreeRecord], head: int, best_head: tuple[int, int], offset: int | None,
                selection: TreeSelection, *, n_perm: int = 10_000, seed: int = 0, alpha: float = 0.05) -> TreeScore:
    """UUAS of flat head `head` (kept in every record) vs right-branching and vs the offset tree."""
    m_head, m_right, m_off, edges = [], [], [], 0
    example = _pick_example(records) if records else None
    example_heads: tuple[int, ...] = ()
    for i, rec in enumerate(records):
        s = rec.sentence
        pred = decode_tree(rec.scores[rec.kept.index(head)].float().numpy(), s.root)
        if i == example:
            example_heads = tuple(pred)
        m_head.append(undirected_matches(pred, s.heads))
        m_right.append(undirected_matches(right_branching(len(s)), s.heads))
        m_off.append(undirected_matches(offset_tree(len(s), s.root, offset), s.heads) if offset is not None else 0)
        edges += len(s) - 1
    h, r, o = (np.array(x, dtype=np.float64) for x in (m_head, m_right, m_off))
    base_name, base = ("right-branching", r) if r.sum() >= o.sum() else (f"offset {offset:+d}", o)
    p = signflip_max_p(h - base, n_perm=n_perm, seed=seed) if len(h) else math.nan
    u = lambda x: float(x.sum()) / edges if edges else math.nan  # noqa: E731
    beats = beats_baseline(p, h.sum(), base.sum(), alpha=alpha)
    verdict = (f"{chosen_head(best_head, None, on=f'{selection.n_sentences} selection sentences')} decodes trees with "
               f"UUAS {u(h):.1%} on {len(h)} test sentences; right-branching {u(r):.1%}, "
               f"offset {'none' if offset is None else f'{offset:+d}'} {u(o):.1%}; "
               f"{'above' if beats else 'not above'} the {base_name} baseline ({format_p(p)}).")
    return TreeScore(best_head=best_head, uuas=u(h), right_branching_uuas=u(r), offset=offset, offset_uuas=u(o),
                     baseline=base_name, p_value=p, n_sentences=len(h), n_edges=edges, select_uuas=selection.uuas,
                     select_sentences=selection.n_sentences, verdict=verdict,
                     example=records[example].sentence if records else None, example_heads=example_heads)
