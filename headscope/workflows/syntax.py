"""Syntactic heads on a treebank: the workflow that runs a model over CoNLL-U sentences and scores them.

`syntax(lm, "test.conllu", select_on="dev.conllu")` reads both files (`analyses.treebank`), extracts
word-level attention with the gold words as the word units (`source.iter_maps` with a segmenter),
keeps per sentence only what the analyses need (`analyses.syntax.summarise`) and scores relations
and trees (`analyses.syntax.score_syntax`). Without `select_on`, the sentences of the one file are
split in two halves at random (fixed seed): heads and offsets are chosen on one, scored on the other.

Trees cost one Chu-Liu/Edmonds decoding per head per sentence, so the tree head is chosen on a
seeded sample of `tree_sample` selection sentences (the size is in the output; None: all of them)
and only that head is decoded on every test sentence.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from headscope.probe.progress import progress as progress_bar

from headscope.analyses.syntax.clusters import head_clusters, head_distances
from headscope.analyses.syntax.relations import SentenceAttention, summarise
from headscope.analyses.syntax.result import SyntaxResult, score_syntax
from headscope.analyses.syntax.trees import TreeSelection, choose_tree_head
from headscope.analyses.selection import head_rank
from headscope.analyses.treebank import Sentence, Treebank, read_conllu, segmenter_for
from headscope.probe.encoding import TOO_LONG
from headscope.probe.forward import attention_layers
from headscope.probe.images import for_input
from headscope.probe.model import LoadedModel
from headscope.probe.names import DEFAULT_ATTENTION, Attention
from headscope.probe.sources import AttentionSource, source_for

from .heads import heads as head_scores

__all__ = ["syntax", "attend", "split_sentences", "syntax_clusters", "TREE_SAMPLE"]
TREE_SAMPLE = 500  # selection sentences on which every head's trees are decoded to choose the tree head


def _treebank(source: str | Path | Treebank) -> Treebank:
    return source if isinstance(source, Treebank) else read_conllu(source)


def split_sentences(sentences: Sequence[Sentence], *, seed: int = 0) -> tuple[list[Sentence], list[Sentence]]:
    """Two halves of a file's sentences at random (fixed seed), each kept in file order: (selection, test)."""
    order = np.random.default_rng(seed).permutation(len(sentences))
    first = set(order[: len(sentences) // 2].tolist())
    return ([s for i, s in enumerate(sentences) if i in first], [s for i, s in enumerate(sentences) if i not in first])


def attend(lm: LoadedModel, sentences: Sequence[Sentence], *, keep: Sequence[int] = (),
           match_trees: Sequence[int] = (), batch_size: int = 8, progress: bool = False, desc: str = "",
           source: AttentionSource | None = None) -> tuple[list[SentenceAttention], dict]:
    """`SentenceAttention` of each sentence that fits the model's context, and the skipped count by reason.

    `keep` lists the flat heads whose tree scores every sentence keeps; for the sentences whose
    position is in `match_trees`, every head's tree is decoded and its matched gold arcs kept.
    `source`: where the attention comes from (`probe.sources`; eager by default). Trees are decoded
    from whole maps, so an eager source streams them and any other assembles each batch's maps.
    """
    limit = lm.max_length
    lengths = [len(ids) for ids in lm.tokenizer([s.text for s in sentences])["input_ids"]] if sentences else []
    fits = [i for i, n in enumerate(lengths) if n <= limit]
    skipped = Counter({f"{TOO_LONG} ({limit} tokens)": len(sentences) - len(fits)} if len(fits) < len(sentences) else {})
    chosen = [sentences[i] for i in fits]
    # The forward passes are the cost, and padding is most of what they waste: batches of sentences of
    # near-equal token length (sorted over the whole file, not within windows of a few batches) pad
    # about a third fewer tokens on EWT. Each sentence's attention is the same; records keep file order.
    by_length = sorted(range(len(chosen)), key=lambda k: lengths[fits[k]])
    texts = [chosen[k].text for k in by_length]
    source = source or source_for(lm, "eager", batch_size=batch_size)
    maps = source.iter_maps(texts, level="word", segmenter=segmenter_for(chosen), window=4)
    if progress:
        maps = progress_bar(maps, total=len(chosen), desc=f"{lm.name} {desc}".strip(), unit="sentence")
    decode = {fits.index(i) for i in set(match_trees) & set(fits)}
    records: list[SentenceAttention | None] = [None] * len(chosen)
    for k, amap in zip(by_length, maps):
        records[k] = summarise(amap, chosen[k], keep=keep, match_trees=k in decode)
    return records, dict(skipped)


def _too_few_sentences(test_tb: Treebank, sel_tb: Treebank | None, limit: int | None) -> str:
    """Why there is not a sentence to choose on and one to score on: none read (and why), or only one."""
    used = "" if limit is None else f" (--limit {limit})"
    for tb in (test_tb, sel_tb):
        if tb is not None and not (tb.sentences[:limit] if limit else tb.sentences):
            skipped = ", ".join(f"{v} × {k}" for k, v in tb.skipped.items()) or "the file holds no sentence"
            return f"{tb.name}: no sentence could be read{used} (skipped: {skipped})"
    return (f"{test_tb.name}: only 1 sentence{used}, and choosing heads on one half and scoring them on the other "
            "needs at least 2; give more sentences, or a second treebank to choose on (--select-on)")


def syntax(lm, conllu: str | Path | Treebank, *, select_on: str | Path | Treebank | None = None,
           subtypes: bool = False, trees: bool = True, tree_sample: int | None = TREE_SAMPLE, n_perm: int = 10_000,
           seed: int = 0, alpha: float = 0.05, batch_size: int = 8, limit: int | None = None,
           progress: bool = False, attention: Attention = DEFAULT_ATTENTION, budget: int | None = None) -> SyntaxResult:
    """Which heads follow which dependency relations on a treebank, honestly selected and tested.

    Heads, offsets and the tree head are chosen on `select_on` (else on a seeded half of `conllu`)
    and scored on `conllu`. `subtypes` keeps relation subtypes (nmod:poss) apart; `limit` uses only
    the first sentences of each file (a subset: the output says how many were used). `attention` and
    `budget` as in `headscope.heads` (a recomputed batch's maps are assembled from blocks; the first
    recomputed sentence is checked against eager attention).
    """
    test_tb = _treebank(conllu)
    if select_on is not None:
        sel_tb = _treebank(select_on)
        select, test = list(sel_tb.sentences[:limit]), list(test_tb.sentences[:limit])
        how = f"heads and offsets chosen on {sel_tb.name}, scored on {test_tb.name}"
        sel_skipped = dict(sel_tb.skipped)
    else:
        select, test = split_sentences(test_tb.sentences[:limit], seed=seed)
        how = (f"heads and offsets chosen on a random half of {test_tb.name} ({len(select)} sentences, seed {seed}), "
               f"scored on the other half")
        sel_skipped = {}
    if not test or not select:
        raise ValueError(_too_few_sentences(test_tb, sel_tb if select_on is not None else None, limit))
    # the treebank is checked before the model is: a two-tower model (CLIP, SigLIP)'s text tower reads the texts;
    # an image model is one line
    lm = for_input(lm, images=False)
    layers, n_heads = attention_layers(lm), lm.config.num_attention_heads  # the maps' layers (a hybrid's: not all)
    rank = head_rank(len(layers), n_heads, seed=seed)
    sample = _tree_sample(select, tree_sample, seed) if trees else []
    how_attend = dict(batch_size=batch_size, progress=progress,
                      source=source_for(lm, attention, budget=budget, batch_size=batch_size))
    sel_records, sel_long = attend(lm, select, match_trees=sample, desc="selection", **how_attend)
    choice: TreeSelection | None = None
    if trees:
        decoded = sum(r.tree_matches is not None for r in sel_records)
        choice = choose_tree_head(sel_records, rank) if decoded else None
        drawn = "all" if decoded == len(sel_records) else f"{decoded} sampled with seed {seed} from the"
        how += f"; tree head chosen on {drawn} {len(sel_records)} selection sentences"
    keep = [choice.head] if choice is not None else ()
    test_records, test_long = attend(lm, test, keep=keep, desc="test", **how_attend)
    skipped = Counter(test_tb.skipped if select_on is not None else {})
    skipped.update(test_long)
    if select_on is None:
        skipped.update(test_tb.skipped)  # the one file's unreadable sentences, listed once
    sel_skipped = Counter(sel_skipped)
    sel_skipped.update(sel_long)
    if sel_skipped:
        how += "; selection sentences skipped: " + ", ".join(f"{v} {k}" for k, v in sel_skipped.items())
    return score_syntax(sel_records, test_records, model=lm.name, treebank=test_tb.name, selection=how,
                        layer_ids=list(layers), head_ids=list(range(n_heads)), tree_selection=choice,
                        skipped=dict(skipped), causal=lm.is_causal, subtypes=subtypes, n_perm=n_perm, seed=seed,
                        alpha=alpha)


def _tree_sample(select: Sequence[Sentence], size: int | None, seed: int) -> list[int]:
    """Positions of `size` selection sentences of at least two words, drawn with `seed` (None: all)."""
    usable = [i for i, s in enumerate(select) if len(s) >= 2]
    if size is None or size >= len(usable):
        return usable
    rng = np.random.default_rng(seed)
    return sorted(rng.choice(usable, size=min(size, len(usable)), replace=False).tolist()) if usable else []


def syntax_clusters(models: Sequence, conllu: str | Path | Treebank, *, n_sentences: int = 100, roles=None,
                    score_roles: bool = False, seed: int = 0, batch_size: int = 8):
    """Heads of one or more models embedded in 2-D by their attention (Clark et al. 2019, Fig. 6).

    Word-level attention over the first `n_sentences` sentences that fit every model, gold words as
    units. Several models can be embedded together only where their units match (same special
    tokens too), else a ValueError says so. `roles`: a roles table to label the points by;
    `score_roles`: label them by each model's roles from `headscope.heads` over those same sentences.
    """
    sentences = list(_treebank(conllu).sentences)
    fit = [s for s in sentences if all(len(lm.tokenizer(s.text)["input_ids"]) <= lm.max_length for lm in models)]
    chosen = fit[:n_sentences]
    maps = [source_for(lm, "eager", batch_size=batch_size).maps([s.text for s in chosen], level="word",
                                                                segmenter=segmenter_for(chosen)) for lm in models]
    distance, heads = head_distances(maps)  # refuses models whose units differ, before any head scoring
    if score_roles:
        roles = pd.concat([head_scores(lm, [s.text for s in chosen], batch_size=batch_size, seed=seed).roles
                           for lm in models], ignore_index=True)
    return head_clusters(distance, heads, roles=roles, seed=seed)
