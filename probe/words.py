"""From sub-word tokens to words.

Words are found in the text itself, not in the tokenizer's pieces, so one rule serves WordPiece
(`##` continuations), byte-level BPE (`Ġ` leading spaces) and SentencePiece (`▁`): a word is a run
of letters/digits (with inner apostrophes: "didn't"), a single punctuation mark, or a single CJK /
kana / hangul character — text without spaces (我爱北京天安门) has one word per character unless
a segmenter is given. A token belongs to the word that holds its first non-space character.

Word-level attention follows Clark et al. (2019): sum over the key pieces of a word, mean over its
query pieces, so rows still sum to 1.
"""

from __future__ import annotations

import re
from typing import Callable, Sequence

import torch

from .types import AttentionMap

__all__ = ["word_spans", "assign_words", "to_word_level", "Segmenter"]

# A segmenter maps a text to the (start, end) character spans of its words, in order.
Segmenter = Callable[[str], Sequence[tuple[int, int]]]

_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af\u3000-\u303f\uff00-\uffef"
_WORD = re.compile(rf"[{_CJK}]|(?:(?![{_CJK}])\w)+(?:['’](?:(?![{_CJK}])\w)+)*|[^\w\s]", re.UNICODE)


def word_spans(text: str, segmenter: Segmenter | None = None) -> list[tuple[int, int]]:
    """Character spans of the words of `text`.

    >>> [ "我爱北京天安门"[a:b] for a, b in word_spans("我爱北京天安门")]
    ['我', '爱', '北', '京', '天', '安', '门']
    >>> ["It didn't.\\n"[a:b] for a, b in word_spans("It didn't.\\n")]
    ['It', "didn't", '.']
    """
    if segmenter is None:
        return [m.span() for m in _WORD.finditer(text)]
    spans = [(int(a), int(b)) for a, b in segmenter(text)]
    for (a, b), (c, _) in zip(spans, spans[1:] + [(len(text), len(text))]):
        if not (0 <= a < b <= c <= len(text)):
            raise ValueError(f"segmenter returned overlapping or out-of-range span {(a, b)} for a text of length {len(text)}")
    return spans


def assign_words(
    text: str,
    token_spans: Sequence[tuple[int, int]],
    special: Sequence[bool],
    segmenter: Segmenter | None = None,
) -> tuple[list[int], list[tuple[int, int]], list[bool]]:
    """Group tokens into word units.

    Returns `(unit_of_token, unit_spans, unit_special)`: each special token is a unit of its own,
    every other token joins the word holding its first non-space character (a whitespace-only token
    joins the next word, else the previous one).
    """
    words = word_spans(text, segmenter)
    starts = [a for a, _ in words]
    word_of_token: list[int | None] = []
    for (a, b), sp in zip(token_spans, special):
        if sp:
            word_of_token.append(None)
            continue
        first = next((i for i in range(a, b) if not text[i].isspace()), None)
        word_of_token.append(_word_containing(first, words, starts) if first is not None else -1)
    _attach_orphans(word_of_token, special)

    unit_of_token: list[int] = []
    unit_spans: list[tuple[int, int]] = []
    unit_special: list[bool] = []
    unit_for_word: dict[int, int] = {}
    for t, w in enumerate(word_of_token):
        if w is None:
            unit_of_token.append(len(unit_spans))
            unit_spans.append((0, 0))
            unit_special.append(True)
        elif w in unit_for_word:
            u = unit_for_word[w]
            unit_of_token.append(u)
            a, b = unit_spans[u]
            unit_spans[u] = (min(a, token_spans[t][0]), max(b, token_spans[t][1]))
        else:
            unit_for_word[w] = len(unit_spans)
            unit_of_token.append(len(unit_spans))
            unit_spans.append(tuple(token_spans[t]))
            unit_special.append(False)
    # A word's span is the word itself, not its tokens' (which may carry a leading space).
    for w, u in unit_for_word.items():
        if w >= 0:
            unit_spans[u] = words[w]
    return unit_of_token, unit_spans, unit_special


def _word_containing(pos: int, words: list[tuple[int, int]], starts: list[int]) -> int:
    import bisect

    i = bisect.bisect_right(starts, pos) - 1
    if i >= 0 and words[i][0] <= pos < words[i][1]:
        return i
    return -1  # a character no word holds (e.g. a control character): treated like whitespace


def _attach_orphans(word_of_token: list[int | None], special: Sequence[bool]) -> None:
    n = len(word_of_token)
    for t in range(n):
        if word_of_token[t] != -1:
            continue
        nxt = next((word_of_token[j] for j in range(t + 1, n) if word_of_token[j] not in (None, -1)), None)
        prev = next((word_of_token[j] for j in range(t - 1, -1, -1) if word_of_token[j] not in (None, -1)), None)
        chosen = nxt if nxt is not None else prev
        # A text of only whitespace tokens has no word at all: give the token a word of its own.
        word_of_token[t] = chosen if chosen is not None else -(t + 2)


def to_word_level(amap: AttentionMap) -> AttentionMap:
    """Aggregate a token-level map to words: keys summed, queries averaged (rows keep summing to 1).

    >>> import torch
    >>> from probe.types import AttentionMap
    >>> a = torch.tensor([[[[0.5, 0.25, 0.25], [0.2, 0.4, 0.4], [0.1, 0.6, 0.3]]]])
    >>> m = AttentionMap(text="ab c", level="token", labels=("a", "##b", "c"), spans=((0, 1), (1, 2), (3, 4)),
    ...                  special=(False,) * 3, attention=a, causal=False, word_index=(0, 0, 1))
    >>> to_word_level(m).attention[0, 0]
    tensor([[0.6500, 0.3500],
            [0.7000, 0.3000]])
    """
    if amap.level == "word":
        return amap
    if len(amap.word_index) != len(amap):
        raise ValueError("this token-level map carries no word_index; extract it with headscope's extract()")
    idx = torch.tensor(amap.word_index)
    n_units = int(idx.max()) + 1 if len(idx) else 0
    member = torch.zeros(len(amap), n_units, dtype=amap.attention.dtype)  # [token, word]
    member[torch.arange(len(amap)), idx] = 1
    mean_q = (member / member.sum(0, keepdim=True)).T  # [word, token], rows average query pieces
    words = torch.einsum("wq,lhqk,kv->lhwv", mean_q, amap.attention, member)  # [layer, head, word, word]

    spans: list[tuple[int, int]] = [(0, 0)] * n_units
    special = [False] * n_units
    labels = [""] * n_units
    for t, u in enumerate(amap.word_index):
        if amap.special[t]:
            special[u], labels[u] = True, amap.labels[t]
    for u in range(n_units):
        if not special[u]:
            a, b = amap.word_spans[u] if amap.word_spans else _union(amap, u)
            spans[u], labels[u] = (a, b), amap.text[a:b]
    return AttentionMap(
        text=amap.text,
        level="word",
        labels=tuple(labels),
        spans=tuple(spans),
        special=tuple(special),
        attention=words,
        causal=amap.causal,
        word_index=tuple(range(n_units)),
        layers=amap.layers,
        heads=amap.heads,
        meta=dict(amap.meta),
    )


def _union(amap: AttentionMap, unit: int) -> tuple[int, int]:
    spans = [amap.spans[t] for t, u in enumerate(amap.word_index) if u == unit]
    return min(a for a, _ in spans), max(b for _, b in spans)
