"""Do heads follow syntax? Per-relation accuracy, a positional baseline, decoded trees, head clusters.

Everything here works on word-level attention already extracted (`probe.extract(..., level="word",
segmenter=...)` with the gold words as segments) and on gold `treebank.Sentence`s; no model. One idea
per file, each name at home there (its docstring tells the method) and re-exported here:

    relations   per-sentence facts (`summarise`, word scores), one example per arc and direction, and
                per relation the head chosen on the selection sentences scored on the test sentences
                against the best fixed offset (Clark et al. 2019)
    trees       each head's word scores decoded into a maximum spanning tree, UUAS against
                right-branching and the offset tree (Htut et al. 2019)
    result      `SyntaxResult`: one model's relations and trees (`score_syntax`)
    clusters    heads placed by the Jensen-Shannon distance between their attention rows (metric MDS;
                Clark et al. 2019, Fig. 6)
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
