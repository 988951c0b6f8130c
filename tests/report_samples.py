"""Hand-built, model-free inputs for the report tests: attention maps with known patterns, and the
real result classes (HeadScores, ProbeResult, Verification) computed from them.

Everything is deterministic and takes milliseconds, so figure/HTML/browser tests need no model.
"""

from __future__ import annotations

import functools

import torch

from headscope.analyses.coref import ProbeScores, score_probe
from headscope.analyses.heads import score_corpus
from headscope.analyses.relations import parse_example
from headscope.probe.types import AttentionMap
from headscope.probe.results import LayerCheck, Verification
from headscope.probe.words import to_word_level, word_spans
from headscope.reports.analysis import ModelAnalysis
from headscope.reports.html import build_report

INJECTED = '<script>alert(1)</script> "><img src=x onerror="window.__xss=1">'
SENTENCES = (
    "The animal didn't cross the street because it was too tired.",
    "我爱北京天安门",
    INJECTED,
)
N_LAYERS, N_HEADS = 3, 4
PREV_HEAD = (0, 1)  # a perfect previous-token head
PROBE_HEAD = (1, 2)  # the head that resolves the probe


def token_map(text: str, *, model: str = "toy", causal: bool = False, layers: int = N_LAYERS,
              heads: int = N_HEADS, seed: int = 0) -> AttentionMap:
    """A token-level map: [CLS] + words (words longer than 5 characters split in two pieces) + [SEP].

    Head PREV_HEAD attends to the previous token (the first row to itself); every other head has
    seeded random rows. Causal maps are masked and renormalised.
    """
    labels, spans, special, word_index, words = ["[CLS]"], [(0, 0)], [True], [0], [(0, 0)]
    for a, b in word_spans(text):
        pieces = [(a, b)] if b - a <= 5 else [(a, a + (b - a) // 2), (a + (b - a) // 2, b)]
        unit = len(words)
        words.append((a, b))
        for i, (s, e) in enumerate(pieces):
            labels.append(("##" if i else "") + text[s:e])
            spans.append((s, e))
            special.append(False)
            word_index.append(unit)
    labels.append("[SEP]")
    spans.append((0, 0))
    special.append(True)
    word_index.append(len(words))
    words.append((0, 0))
    n = len(labels)
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(layers, heads, n, n, generator=g) * 2  # [layer, head, query, key]
    if causal:
        logits = logits.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    att = logits.softmax(-1)
    prev = torch.zeros(n, n)
    prev[0, 0] = 1
    prev[torch.arange(1, n), torch.arange(n - 1)] = 1
    att[PREV_HEAD] = prev
    return AttentionMap(text=text, level="token", labels=tuple(labels), spans=tuple(spans), special=tuple(special),
                        attention=att, causal=causal, word_index=tuple(word_index), word_spans=tuple(words),
                        meta={"model": model})


def verification(model: str = "toy", *, passed: bool = True, layers: int = N_LAYERS) -> Verification:
    checks = tuple(LayerCheck(i, 2e-7 * (i + 1), 1e-6, 3e-6, 2e-7 * (i + 1), True) for i in range(layers))
    if not passed:
        checks = checks[:-1] + (LayerCheck(layers - 1, 0.2, 0.4, 0.5, 0.3, False),)
    return Verification(model, "bert", "float32", 1e-5, 1e-5, N_HEADS, 3, 40, checks, 0.01, 0.002)


def probe_result(model: str = "toy", *, n: int = 40, task: str = "coref-toy"):
    """A ProbeResult where PROBE_HEAD picks the answer in 36 of 40 examples, every other head in half."""
    names = [("Mary", "John", "she", "he"), ("Anna", "Peter", "she", "he")]
    examples = []
    for i in range(n):
        a, b, pa, pb = names[i % 2]
        pron, ans = (pa, a) if i % 4 < 2 else (pb, b)
        examples.append(parse_example({"text": f"{a} told {b} that {pron} would call ({i}).", "pronoun": pron,
                                       "candidates": [a, b], "answer": ans}, index=i))
    g = torch.Generator().manual_seed(1)
    scores = torch.rand(n, N_LAYERS, N_HEADS, 2, generator=g)  # [example, layer, head, candidate]
    for i, ex in enumerate(examples):
        right = ex.answer if i % 10 else 1 - ex.answer  # wrong on every tenth example
        scores[i, PROBE_HEAD[0], PROBE_HEAD[1]] = torch.tensor([0.1, 0.1])
        scores[i, PROBE_HEAD[0], PROBE_HEAD[1], right] = 0.8
    data = ProbeScores(examples=tuple(examples), scores=scores, model=model, level="word")
    return score_probe(data, task=task, n_perm=200)


def section(model: str = "toy", *, causal: bool = False, passed: bool = True, texts=SENTENCES) -> ModelAnalysis:
    maps = tuple(token_map(t, model=model, causal=causal, seed=i) for i, t in enumerate(texts))
    scores = score_corpus(maps, level="token", model=model)
    import pandas as pd

    corpus = pd.DataFrame([{"corpus": "toy", "source": "hand-built", "texts": len(texts), "words": 20, "tokens": 30}])
    return ModelAnalysis(model=model, maps=maps, verification=verification(model, passed=passed), scores=scores,
                        probes=(probe_result(model),), corpus=corpus,
                        info={"family": "toy", "layers": N_LAYERS, "heads": N_HEADS, "file": INJECTED})


@functools.lru_cache(maxsize=1)
def two_model_report():
    """An encoder and a decoder side by side (built once per test session: drawing takes seconds)."""
    sections = (section("toy-enc"), section("toy-dec", causal=True))
    report = build_report(sections, settings={"corpus": INJECTED, "level": "token"}, versions={"torch": "x"})
    return sections, report
