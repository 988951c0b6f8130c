"""Which head points a source word at its target: relation probes, coreference the best known of them.

    examples ──extract_scores──> ProbeScores [example, layer, head, candidate]   (attention from each source
                                                                                 to each candidate)
             ──analyses.coref.score_probe──> ProbeResult   head chosen on one split, scored on another,
                                                           baselines, interval, permutation p, a verdict

`relation_probe` does both; `coref` is it with the words of coreference; `probe_sets` scores several
named sets on one model (`workflows.ablation.ablate_chosen_head` then asks a decoder whether the
chosen head matters for its choice between the candidates). The attention source (`probe.sources`) is chosen once per call:
a recomputed text keeps only its sources' query rows (`analyses.coref.query_rows`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from typing import Sequence

import torch

from headscope.probe.progress import progress as progress_bar

from headscope.analyses.coref import (CAUSAL_REASON, Excluded, ProbeResult, ProbeScores, candidate_units,
                                      collect_scores, concat_scores, query_rows, score_probe)
from headscope.analyses.relations import RelationExample
from headscope.distributed import World, sharded_probe_scores
from headscope.probe.encoding import TOO_LONG
from headscope.probe.images import for_input
from headscope.probe.model import LoadedModel
from headscope.probe.names import DEFAULT_ATTENTION, Attention, Level
from headscope.probe.reading import Fold, Reading
from headscope.probe.sources import AttentionSource, source_for
from headscope.probe.types import Units
from headscope.probe.words import to_word_level, word_spans

__all__ = ["extract_scores", "relation_probe", "coref", "probe_sets"]


def extract_scores(lm: LoadedModel, examples: Sequence[RelationExample], *, level: Level = "word",
                   head_word: bool = False, batch_size: int = 8, crop: bool = True, progress: bool = False,
                   attention: Attention = DEFAULT_ATTENTION, budget: int | None = None,
                   world: World | None = None) -> ProbeScores:
    """Attention from each example's source to each candidate on `lm` -> `analyses.coref.ProbeScores`.

    Texts are deduplicated and run shortest first (little padding); an example that cannot be
    scored is counted in `excluded` by reason: longer than the context, a candidate after the
    source for a decoder, a word cut from the map. The result keeps the input order.

    `crop` (decoders only): run each text only up to the end of the source's word. A causal
    model's attention from the source does not depend on anything after it, so this changes no
    number (as long as the tokenizer does not merge a token across that word boundary, which
    byte-level BPE never does) and saves the cost of the rest of a long paragraph.

    `attention` and `budget` as in `heads`: a recomputed text keeps only its sources' query rows,
    taken from the blocks as they pass (`analyses.coref.query_rows`); `data.check` records the check.
    `world` (a `headscope.distributed.World`, in a torchrun run): each process scores its shard of
    the examples and every process returns all of them, gathered.

    >>> from headscope.probe.tiny import tiny_model
    >>> from headscope.analyses.relations import builtin_set
    >>> data = extract_scores(tiny_model("bert"), builtin_set("agreement")[:3])
    >>> len(data), tuple(data.scores.shape[1:3])
    (3, (2, 4))
    """
    # a two-tower model (CLIP, SigLIP): its text tower reads the texts; an image model: one line
    lm = for_input(lm, images=False)
    if world is not None and world.size > 1:
        return sharded_probe_scores(lambda part: extract_scores(lm, part, level=level, head_word=head_word,
                                                                batch_size=batch_size, crop=crop, progress=progress,
                                                                attention=attention, budget=budget),
                                    examples, world)
    source = source_for(lm, attention, budget=budget, batch_size=batch_size)
    excluded: Counter = Counter()
    keep = []
    for ex in examples:
        if lm.is_causal and not all(ex.preceding()):
            excluded[CAUSAL_REASON] += 1
        else:
            keep.append(ex)
    model_text = {id(ex): _cropped(ex) if crop and lm.is_causal else ex.text for ex in keep}
    texts = list(dict.fromkeys(model_text[id(ex)] for ex in keep))
    length = {t: len(lm.tokenizer(t)["input_ids"]) for t in texts}
    too_long = {t for t in texts if length[t] > lm.max_length}
    if too_long:
        excluded[f"{TOO_LONG} ({lm.max_length} tokens)"] = sum(model_text[id(ex)] in too_long for ex in keep)
        keep = [ex for ex in keep if model_text[id(ex)] not in too_long]
        texts = [t for t in texts if t not in too_long]
    texts.sort(key=lambda t: length[t])
    by_text: dict[str, list] = {}
    for ex in keep:
        by_text.setdefault(model_text[id(ex)], []).append(ex)

    def pairs():
        readings = source.read(texts, level=level, window=2)
        if progress:
            readings = progress_bar(readings, total=len(texts), desc=f"{lm.name} attention", unit="text")
        for reading in readings:
            found = _Found(source, by_text, level=level, head_word=head_word)
            reading.fold(found)
            yield from found.pairs

    data = collect_scores(pairs(), head_word=head_word, excluded=dict(excluded))
    if source.check is not None:
        data = replace(data, check=source.check.to_dict())
    if not len(data):
        return _no_scores(lm, data, level)
    position = {id(ex): i for i, ex in enumerate(examples)}
    order = sorted(range(len(data)), key=lambda i: position[id(data.examples[i])])
    return replace(data, examples=tuple(data.examples[i] for i in order), scores=data.scores[order],
                   model=data.model or lm.name, level=level)


class _Found(Fold):
    """Each example of a reading's text with what it is scored on: the text's eager map, or, for a text recomputed
    in blocks, only the query rows its examples' sources need (`analyses.coref.query_rows`)."""

    def __init__(self, source: AttentionSource, by_text: dict, *, level: Level, head_word: bool) -> None:
        self.source, self.by_text, self.level, self.head_word = source, by_text, level, head_word
        self.pairs: list = []

    def map(self, amap) -> None:
        self.pairs += [(ex, amap) for ex in self.by_text[amap.text]]

    def blocks(self, reading: Reading, blocks) -> None:
        [units] = reading.units
        examples = self.by_text[units.text]
        rows = _query_rows(self.source, units, blocks, examples, level=self.level, head_word=self.head_word)
        self.pairs += [(ex, rows) for ex in examples]


def _query_rows(source: AttentionSource, units: Units, blocks, examples: Sequence[RelationExample], *, level: Level,
                head_word: bool):
    """The query rows of one text that its examples' sources need, from its recomputed blocks (not read at all
    when none is needed)."""
    lm = source.lm
    scored = to_word_level(units) if level == "word" else units
    wanted: set[int] = set()
    for ex in examples:
        try:
            wanted.update(candidate_units(scored, ex, causal=lm.is_causal, head_word=head_word)[0])
        except Excluded:  # counted when the example is scored
            pass
    return query_rows(units, blocks if wanted else (), wanted, level=level, causal=lm.is_causal,
                      meta={"model": lm.name}, layers=source.all_layers, heads=source.all_heads)


def _no_scores(lm: LoadedModel, data: ProbeScores, level: str) -> ProbeScores:
    """Nothing scored: keep the model's real layers and heads so that tables still name them."""
    n_layers, n_heads = lm.config.num_hidden_layers, lm.config.num_attention_heads
    return replace(data, scores=torch.zeros(0, n_layers, n_heads, 2), layer_ids=tuple(range(n_layers)),
                   head_ids=tuple(range(n_heads)), model=lm.name, level=level, causal=lm.is_causal)


def _cropped(ex: RelationExample) -> str:
    """The text up to the end of the word that holds the end of the source."""
    end = ex.source_span[1]
    return ex.text[: max([end] + [b for a, b in word_spans(ex.text) if a < end <= b])]


def relation_probe(lm: LoadedModel, examples: Sequence[RelationExample], *, task: str, level: Level = "word",
                   head_word: bool = False, heldout: Sequence[RelationExample] | None = None, folds: int = 5,
                   n_perm: int = 10_000, seed: int = 0, batch_size: int = 8, noun: str = "examples",
                   progress: bool = False, attention: Attention = DEFAULT_ATTENTION, budget: int | None = None,
                   world: World | None = None) -> ProbeResult:
    """Which head lets a source word attend to its target: extraction, then `analyses.coref.score_probe`.

    The head is chosen by group k-fold on `examples`; with `heldout` (a second list of examples)
    it is chosen on all of `examples` and scored on `heldout`. Returns a `ProbeResult`.
    `world`: extraction sharded over the processes of a torchrun run (`extract_scores`); every
    process then scores the gathered examples, all with the same numbers.

    >>> from headscope.probe.tiny import tiny_model
    >>> from headscope.analyses.relations import builtin_set
    >>> r = relation_probe(tiny_model("bert"), builtin_set("verb-subject")[:20], task="verb-subject", n_perm=200)
    >>> r.n, len(r.heads)
    (20, 8)
    """
    kw = dict(level=level, head_word=head_word, batch_size=batch_size, progress=progress, attention=attention,
              budget=budget, world=world)
    data = extract_scores(lm, examples, **kw)
    test = None if heldout is None else extract_scores(lm, heldout, **kw)
    return score_probe(data, task=task, heldout=test, folds=folds, n_perm=n_perm, seed=seed, noun=noun)


def coref(lm: LoadedModel, examples: Sequence[RelationExample], *, task: str = "coref", noun: str = "pronouns",
          **options) -> ProbeResult:
    """Which head lets a pronoun attend to the word it refers to -> `ProbeResult` (see `relation_probe`).

    >>> import headscope as hs                                                    # doctest: +SKIP
    >>> hs.coref(hs.load("minilm"), hs.builtin_set("agreement"), task="coref-agreement").verdict  # doctest: +SKIP
    """
    return relation_probe(lm, examples, task=task, noun=noun, **options)


def probe_sets(lm: LoadedModel, sets: Sequence[tuple[str, Sequence[RelationExample]]], *,
               heldout: tuple[str, Sequence[RelationExample]] | None = None, combined_task: str = "combined",
               level: Level = "word", head_word: bool = False, folds: int = 5, n_perm: int = 10_000, seed: int = 0,
               batch_size: int = 8, noun: str = "examples", progress: bool = False,
               attention: Attention = DEFAULT_ATTENTION, budget: int | None = None,
               world: World | None = None) -> tuple[ProbeResult, list[ProbeResult]]:
    """Score named probe sets `[(task, examples), ...]` on one model -> `(main, parts)`.

    With several sets each is scored on its own (`parts`) and `main` scores them together as
    `combined_task`; with one set `main` is that set and `parts` is empty. With `heldout` (one set
    only) `main` is the head chosen on all of the set and scored on `heldout`, and `parts` keeps
    the k-fold result inside the set: one extraction, two honest answers. `world`: as in `relation_probe`.

    >>> from headscope.probe.tiny import tiny_model
    >>> from headscope.analyses.relations import builtin_set
    >>> main, parts = probe_sets(tiny_model("bert"), [("a", builtin_set("agreement")[:16]),
    ...                                                ("w", builtin_set("winograd")[:16])], n_perm=200)
    >>> main.task, main.n, [p.n for p in parts]
    ('combined', 32, [16, 16])
    """
    if heldout is not None and len(sets) != 1:
        raise ValueError("a held-out set needs a single set to choose the head on")
    ex_kw = dict(level=level, head_word=head_word, batch_size=batch_size, progress=progress, attention=attention,
                 budget=budget, world=world)
    kw = dict(folds=folds, n_perm=n_perm, seed=seed, noun=noun)
    if heldout is not None:
        (task, examples), (h_task, h_examples) = sets[0], heldout
        data, test = (extract_scores(lm, exs, **ex_kw) for exs in (examples, h_examples))
        return score_probe(data, task=f"{task}->{h_task}", heldout=test, **kw), [score_probe(data, task=task, **kw)]
    data = [extract_scores(lm, exs, **ex_kw) for _, exs in sets]
    parts = [score_probe(d, task=task, **kw) for d, (task, _) in zip(data, sets, strict=True)] if len(sets) > 1 else []
    main = score_probe(concat_scores(data), task=combined_task if len(sets) > 1 else sets[0][0], **kw)
    return main, parts

