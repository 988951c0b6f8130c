"""Do heads follow syntax? Per-relation accuracy, a positional baseline, decoded trees, head clusters.

One idea per file, each name at home there and re-exported here:

    relations   per-sentence facts (`summarise`, word scores), arcs, per-relation scores against an offset
    trees       dependency trees decoded from one head's word scores, scored against right-branching
    result      `SyntaxResult`: one model's relations and trees (`score_syntax`)
    clusters    heads placed by the Jensen-Shannon distance between their attention rows

Everything here works on word-level attention already extracted (`probe.extract(..., level="word",
segmenter=...)` with the gold words as segments) and on gold `treebank.Sentence`s; no model.

1. `summarise(amap, sentence)` -> `SentenceAttention`: for every head, the word each word attends
   to most (special tokens and the word itself excluded; an exact tie is no pick), and, for the heads
   kept, the word-to-word scores used to decode trees.
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
4. Trees (Htut et al. 2019): each head's word-to-word scores decoded into a maximum spanning
   arborescence (Chu-Liu/Edmonds) rooted at the gold root; undirected unlabeled attachment score
   (UUAS) of the head chosen on the selection sentences vs a right-branching chain and vs the best
   offset tree.
5. Head clusters (Clark et al. 2019, Fig. 6): mean Jensen-Shannon distance between every pair of
   heads' attention rows over a corpus, embedded in 2-D by metric MDS (scikit-learn).

Decoders are causal: a query sees only earlier words, so an answer after it cannot be attended to.
Those examples are kept (the table compares models on the same arcs) and counted in `n_after`.
"""

from __future__ import annotations

from .clusters import embed_heads, head_clusters, head_distances
from .relations import (ALL_RELATIONS, Arcs, DIRECTIONS, Direction, MIN_EXAMPLES, NOT_IN_MAP, RelationScore,
                        SHARED_UNIT, SentenceAttention, best_offset, collect_arcs, score_relations, summarise,
                        top_units, unit_of_words, word_scores)
from .result import SyntaxResult, score_syntax
from .trees import (TreeRecord, TreeScore, TreeSelection, choose_tree_head, decode_tree, offset_tree, right_branching,
                    score_trees, undirected_matches)

__all__ = [
    "Direction", "DIRECTIONS", "ALL_RELATIONS", "MIN_EXAMPLES", "NOT_IN_MAP", "SHARED_UNIT",
    "SentenceAttention", "Arcs", "RelationScore", "unit_of_words", "top_units", "word_scores", "summarise",
    "collect_arcs", "best_offset", "score_relations", "TreeRecord", "TreeSelection", "TreeScore",
    "decode_tree", "undirected_matches", "right_branching", "offset_tree", "choose_tree_head", "score_trees",
    "SyntaxResult", "score_syntax", "head_distances", "embed_heads", "head_clusters",
]
