"""One model's syntax result: the relations (`analyses.syntax.relations`) and trees (`analyses.syntax.trees`)
scored on the same selection and test sentences."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

import pandas as pd

from .relations import (ALL_RELATIONS, DIRECTIONS, MIN_EXAMPLES, Direction, RelationScore, SentenceAttention,
                        best_offset, collect_arcs, score_relations)
from .trees import TreeScore, TreeSelection, score_trees

__all__ = ["SyntaxResult", "score_syntax"]


@dataclass(frozen=True, eq=False)
class SyntaxResult:
    """Per-relation head-vs-offset table, the tidy per-head table and the tree scores of one model."""

    model: str
    treebank: str
    selection: str  # how the selection and test sentences were obtained, in words
    n_sentences: int  # test sentences scored
    n_skipped: int  # test sentences skipped (unaligned, longer than the context)
    skipped: dict
    n_select_sentences: int
    relations: tuple[RelationScore, ...]
    heads: pd.DataFrame
    trees: TreeScore | None
    excluded: dict = field(default_factory=dict)
    causal: bool = False
    subtypes: bool = False
    n_permutations: int = 0
    alpha: float = 0.05
    notes: tuple[str, ...] = ()

    def relation(self, relation: str, direction: Direction = "dependent->head") -> RelationScore:
        for r in self.relations:
            if (r.relation, r.direction) == (relation, direction):
                return r
        raise KeyError(f"no relation {relation!r} ({direction}) in this result")

    def to_frame(self) -> pd.DataFrame:
        """The tidy per-head table (one row per relation x direction x head)."""
        return self.heads.assign(model=self.model)[["model", *self.heads.columns]]

    def to_dict(self) -> dict:
        return {
            "model": self.model,
            "n_sentences": self.n_sentences,
            "n_skipped": self.n_skipped,
            "relations": [r.to_dict() for r in self.relations],
            "trees": None if self.trees is None else self.trees.to_dict(),
            "treebank": self.treebank,
            "selection": self.selection,
            "n_select_sentences": self.n_select_sentences,
            "skipped": dict(self.skipped),
            "excluded": dict(self.excluded),
            "causal": self.causal,
            "subtypes": self.subtypes,
            "n_permutations": self.n_permutations,
            "alpha": self.alpha,
            "notes": list(self.notes),
        }


def score_syntax(select: Sequence[SentenceAttention], test: Sequence[SentenceAttention], *, model: str,
                 treebank: str, selection: str, layer_ids: Sequence[int], head_ids: Sequence[int],
                 tree_selection: TreeSelection | None = None, skipped: Mapping[str, int] | None = None,
                 causal: bool = False, subtypes: bool = False, n_perm: int = 10_000, seed: int = 0,
                 alpha: float = 0.05, min_examples: int = MIN_EXAMPLES) -> SyntaxResult:
    """Relations (selection -> test) and, given a `tree_selection` whose head every test record keeps, trees."""
    s_arcs, t_arcs = collect_arcs(select, subtypes=subtypes), collect_arcs(test, subtypes=subtypes)
    relations, heads = score_relations(s_arcs, t_arcs, layer_ids, head_ids, n_perm=n_perm, seed=seed, alpha=alpha,
                                       min_examples=min_examples)
    trees = None
    if tree_selection is not None and test:
        li, hi = divmod(tree_selection.head, len(head_ids))
        offset = best_offset([s_arcs.offsets[i] for i in s_arcs.where(ALL_RELATIONS, DIRECTIONS[0])])
        trees = score_trees(test, tree_selection.head, (layer_ids[li], head_ids[hi]), offset, tree_selection,
                            n_perm=n_perm, seed=seed, alpha=alpha)
    excluded = {**{f"selection: {k}": v for k, v in s_arcs.excluded.items()},
                **{f"test: {k}": v for k, v in t_arcs.excluded.items()}}
    notes = ()
    if causal:
        after = int(t_arcs.after.sum())
        notes = (f"{after} of {len(t_arcs)} test examples have their answer after the query word; a decoder's "
                 f"query sees only earlier words, so no head can get those (counted in each row's n_after).",)
    skipped = dict(skipped or {})
    return SyntaxResult(model=model, treebank=treebank, selection=selection, n_sentences=len(test),
                        n_skipped=sum(skipped.values()), skipped=skipped, n_select_sentences=len(select),
                        relations=tuple(relations), heads=heads, trees=trees, excluded=excluded, causal=causal,
                        subtypes=subtypes, n_permutations=n_perm, alpha=alpha, notes=notes)
