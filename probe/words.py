"""From sub-word tokens to words.

Words are found in the text itself, not in the tokenizer's pieces, so one rule serves WordPiece
(`##` continuations), byte-level BPE (`Ġ` leading spaces) and SentencePiece (`▁`): a word is a run
of letters/digits (with inner apostrophes: "didn't"), a single punctuation mark, or a single CJK /
kana / hangul character — text without spaces (我爱北京天安门) has one word per character unless
a segmenter is given. The rule reads user-perceived characters (Unicode grapheme clusters), not
code points: a combining accent stays with its letter (decomposed "café" is one word) and an
emoji joined by zero-width joiners is one mark. A token belongs to the word that holds its first
non-space character.

Word-level attention follows Clark et al. (2019): sum over the key pieces of a word, mean over its
query pieces, so rows still sum to 1.
"""

from __future__ import annotations

import dataclasses

import bisect
import re
from typing import TYPE_CHECKING, Callable, Sequence

import regex

if TYPE_CHECKING:  # annotations only: torch is imported by the functions that compute with it
    import torch

from .types import AttentionMap, CrossAttentionMap, ImageCrossAttention, Seq2SeqAttention, Units

__all__ = ["word_spans", "assign_words", "to_word_level", "Segmenter"]

# A segmenter maps a text to the (start, end) character spans of its words, in order.
Segmenter = Callable[[str], Sequence[tuple[int, int]]]

_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af\u3000-\u303f\uff00-\uffef"
_WORD = re.compile(rf"[{_CJK}]|(?:(?![{_CJK}])\w)+(?:['’](?:(?![{_CJK}])\w)+)*|[^\w\s]", re.UNICODE)
_GRAPHEME = regex.compile(r"\X")  # one extended grapheme cluster (Unicode UAX #29)


def word_spans(text: str, segmenter: Segmenter | None = None) -> list[tuple[int, int]]:
    """Character spans of the words of `text`.

    >>> [ "我爱北京天安门"[a:b] for a, b in word_spans("我爱北京天安门")]
    ['我', '爱', '北', '京', '天', '安', '门']
    >>> ["It didn't.\\n"[a:b] for a, b in word_spans("It didn't.\\n")]
    ['It', "didn't", '.']
    """
    if segmenter is None:
        return _rule_spans(text)
    spans = [(int(a), int(b)) for a, b in segmenter(text)]
    if not spans and text.strip():  # with no word, every token would be an orphan and the text one unit
        raise ValueError(f"segmenter returned no word span for the text {text[:40]!r}; it must return the "
                         "(start, end) span of at least one word")
    for (a, b), (c, _) in zip(spans, spans[1:] + [(len(text), len(text))]):
        if not (0 <= a < b <= c <= len(text)):
            raise ValueError(f"segmenter returned overlapping or out-of-range span {(a, b)} for a text of length {len(text)}")
    return spans


def _rule_spans(text: str) -> list[tuple[int, int]]:
    """The word rule applied to grapheme clusters, each standing in as its first (base) character.

    >>> _rule_spans("cafe\u0301 nai\u0308ve")  # two words of 5 and 6 code points
    [(0, 5), (6, 12)]
    """
    clusters = [m.span() for m in _GRAPHEME.finditer(text)]
    if len(clusters) == len(text):  # one code point per cluster: the rule reads the text as it is
        return [m.span() for m in _WORD.finditer(text)]
    bases = "".join(text[a] for a, _ in clusters)
    return [(clusters[i][0], clusters[j - 1][1]) for i, j in (m.span() for m in _WORD.finditer(bases))]


def assign_words(
    text: str,
    token_spans: Sequence[tuple[int, int]],
    special: Sequence[bool],
    segmenter: Segmenter | None = None,
) -> tuple[list[int], list[tuple[int, int]], list[bool]]:
    """Group tokens into word units.

    Returns `(unit_of_token, unit_spans, unit_special)`: each special token is a unit of its own;
    every other token joins the word holding its first non-space character. A token that spans
    several words (SentencePiece's "北京") merges them into one unit; a whitespace-only token joins
    the next word where no special token stands between them, else the previous one on the same terms,
    else it is a unit of its own.

    Every unit is one run of consecutive tokens, so the units keep the tokens' order and a causal
    map stays causal at word level: a unit that held a token before a special one (an image token, a
    chat template's marker) and one after it would let its earlier token's row read the later keys.
    A token whose word's unit does not end just before it therefore starts a unit of its own.

    >>> assign_words("我爱北京", [(0, 1), (1, 2), (2, 4)], [False] * 3)
    ([0, 1, 2], [(0, 1), (1, 2), (2, 4)], [False, False, False])
    """
    words = word_spans(text, segmenter)
    touched = [_words_touched(text, a, b, words) for (a, b) in token_spans]  # per token: word ids, [] if none
    _attach_orphans(touched, special)

    unit_of_token: list[int] = []
    unit_spans: list[tuple[int, int]] = []
    unit_special: list[bool] = []
    unit_of_word: dict[int, int] = {}
    for t, ws in enumerate(touched):
        if special[t]:
            unit_of_token.append(len(unit_spans))
            unit_spans.append((0, 0))
            unit_special.append(True)
            continue
        previous = unit_of_token[-1] if unit_of_token else None
        joins = previous is not None and any(unit_of_word.get(w) == previous for w in ws)
        u = previous if joins else len(unit_spans)  # only the unit just before it: units stay consecutive
        if not joins:
            unit_spans.append(tuple(token_spans[t]) if ws[0] < 0 else words[ws[0]])
            unit_special.append(False)
        for w in ws:
            unit_of_word[w] = u
            a, b = unit_spans[u]
            wa, wb = token_spans[t] if w < 0 else words[w]
            unit_spans[u] = (min(a, wa), max(b, wb))
        unit_of_token.append(u)
    return unit_of_token, unit_spans, unit_special


def _words_touched(text: str, a: int, b: int, words: list[tuple[int, int]]) -> list[int]:
    """Ids of the words holding a non-space character of [a, b), in order."""
    hits: list[int] = []
    i = max(bisect.bisect_right(words, (a, len(text) + 1)) - 1, 0)
    while i < len(words) and words[i][0] < b:
        wa, wb = words[i]
        part = text[max(a, wa) : min(b, wb)]
        if part and not part.isspace():  # a non-space character of the token inside the word
            hits.append(i)
        i += 1
    return hits


def _attach_orphans(touched: list[list[int]], special: Sequence[bool]) -> None:
    """A token on no word (whitespace, a control character) joins the next word, else the previous, never
    across a special token (the space a chat template puts before an image stays out of the word after it)."""
    n = len(touched)
    for t in range(n):
        if special[t] or touched[t]:
            continue
        nxt = _nearest(touched, special, range(t + 1, n), 0)
        prev = _nearest(touched, special, range(t - 1, -1, -1), -1)
        chosen = nxt if nxt is not None else prev
        # Only whitespace tokens: the token becomes a word of its own (a negative id no word has).
        touched[t] = [chosen if chosen is not None else -(t + 1)]


def _nearest(touched: list[list[int]], special: Sequence[bool], order: range, end: int) -> int | None:
    """The first word met walking `order` from an orphan token over orphans only (its `end` word id), None
    where a special token or the text's end comes first."""
    for j in order:
        if special[j]:
            return None
        if touched[j]:
            return touched[j][end]
    return None


def to_word_level(amap):
    """Aggregate a token-level map to words: keys summed, queries averaged (rows keep summing to 1).

    Takes an `AttentionMap`, a `CrossAttentionMap` (queries pooled over the target's words, keys over
    the source's), a `Seq2SeqAttention` (all three maps) or the `Units` of a text (its words' labels,
    spans and special flags, for attention that comes in blocks).

    >>> import torch
    >>> from headscope.probe.types import AttentionMap
    >>> a = torch.tensor([[[[0.5, 0.25, 0.25], [0.2, 0.4, 0.4], [0.1, 0.6, 0.3]]]])
    >>> m = AttentionMap(text="ab c", level="token", labels=("a", "##b", "c"), spans=((0, 1), (1, 2), (3, 4)),
    ...                  special=(False,) * 3, attention=a, causal=False, word_index=(0, 0, 1))
    >>> to_word_level(m).attention[0, 0]
    tensor([[0.6750, 0.3250],
            [0.7000, 0.3000]])
    """
    convert = _TO_WORDS.get(type(amap))
    if convert is None:
        raise TypeError(f"to_word_level takes an AttentionMap, CrossAttentionMap, Seq2SeqAttention or Units, "
                        f"not {type(amap).__name__}")
    return convert(amap)


def _pool(attention: torch.Tensor, query_index: Sequence[int], key_index: Sequence[int]) -> torch.Tensor:
    """[layer, head, query token, key token] -> [layer, head, query word, key word]: mean over a query
    word's pieces, sum over a key word's pieces."""
    import torch
    member = _membership(key_index, attention.dtype)  # [token, word]
    mean_q = member if query_index is key_index else _membership(query_index, attention.dtype)  # a map's own words
    mean_q = (mean_q / mean_q.sum(0, keepdim=True)).T  # [word, token], rows average query pieces
    return torch.einsum("wq,lhqk,kv->lhwv", mean_q, attention, member)  # [layer, head, word, word]


def _membership(word_index: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
    """0/1 `[token, word]`: token t belongs to word `word_index[t]`."""
    import torch
    if not len(word_index):
        return torch.zeros(0, 0, dtype=dtype)
    return torch.nn.functional.one_hot(torch.tensor(word_index, dtype=torch.long), max(word_index) + 1).to(dtype)


def _word_units(units) -> tuple[tuple[str, ...], tuple[tuple[int, int], ...], tuple[bool, ...]]:
    """(labels, spans, special) of the words of a token-level `AttentionMap` or `Units`."""
    n_units = max(units.word_index) + 1 if units.word_index else 0
    spans: list[tuple[int, int]] = [(0, 0)] * n_units
    special = [False] * n_units
    labels = [""] * n_units
    for t, u in enumerate(units.word_index):
        if units.special[t]:
            special[u], labels[u] = True, units.labels[t]
    for u in range(n_units):
        if not special[u]:
            a, b = units.word_spans[u] if units.word_spans else _union(units, u)
            spans[u], labels[u] = (a, b), units.text[a:b]
    return tuple(labels), tuple(spans), tuple(special)


def _check_word_index(units) -> None:
    if len(units.word_index) != len(units):
        raise ValueError("this token-level map carries no word_index; extract it with headscope's extract()")


def _map_to_words(amap: AttentionMap) -> AttentionMap:
    if amap.level == "word":
        return amap
    if amap.is_image:  # an image's patches are its units at both levels
        return dataclasses.replace(amap, level="word")
    _check_word_index(amap)
    words = _pool(amap.attention, amap.word_index, amap.word_index)
    labels, spans, special = _word_units(amap)
    return AttentionMap(
        text=amap.text,
        level="word",
        labels=labels,
        spans=spans,
        special=special,
        attention=words,
        causal=amap.causal,
        word_index=tuple(range(len(labels))),
        layers=amap.layers,
        heads=amap.heads,
        meta=dict(amap.meta),
        sinks=amap.sinks,  # a word's row sums what its tokens' rows (averaged) left to the sink
        no_attention=amap.no_attention,
        patches=_word_patches(amap),
        pictures=amap.pictures,
    )


def _units_to_words(units: Units) -> Units:
    if units.level == "word":
        return units
    _check_word_index(units)
    labels, spans, special = _word_units(units)
    return Units(units.text, "word", labels, spans, special, word_index=tuple(range(len(labels))),
                 patches=_word_patches(units))


def _word_patches(units) -> tuple:
    """A vision–language text's `patches` at word level: a word made of one image token keeps its cell (image
    tokens are units of their own at both levels); () for a text without images."""
    if not units.patches:
        return ()
    n_units = max(units.word_index) + 1 if units.word_index else 0
    sizes = [0] * n_units
    for u in units.word_index:
        sizes[u] += 1
    out: list = [None] * n_units
    for t, u in enumerate(units.word_index):
        if units.patches[t] is not None and sizes[u] == 1:
            out[u] = units.patches[t]
    return tuple(out)


def _cross_to_words(cmap: CrossAttentionMap) -> CrossAttentionMap:
    if cmap.level == "word":
        return cmap
    _check_word_index(cmap.queries)
    _check_word_index(cmap.keys)
    words = _pool(cmap.attention, cmap.queries.word_index, cmap.keys.word_index)
    return CrossAttentionMap(queries=_units_to_words(cmap.queries), keys=_units_to_words(cmap.keys), attention=words,
                             layers=cmap.layers, heads=cmap.heads, meta=dict(cmap.meta))


def _seq2seq_to_words(s: Seq2SeqAttention) -> Seq2SeqAttention:
    return Seq2SeqAttention(encoder=_map_to_words(s.encoder), decoder=_map_to_words(s.decoder),
                            cross=_cross_to_words(s.cross))


def _image_cross_to_words(p: ImageCrossAttention) -> ImageCrossAttention:
    """A cross-attention reader's pair at word level: the text's words (queries averaged over their tokens), each
    image key a unit of its own at both levels (as an image's patches are)."""
    cmap = p.cross
    if cmap.level == "word":
        return p
    _check_word_index(cmap.queries)
    keys = range(len(cmap.keys))
    words = _pool(cmap.attention, cmap.queries.word_index, keys)
    cross = CrossAttentionMap(queries=_units_to_words(cmap.queries), attention=words, layers=cmap.layers,
                              heads=cmap.heads, meta=dict(cmap.meta),
                              keys=dataclasses.replace(cmap.keys, level="word", word_index=tuple(keys)))
    return ImageCrossAttention(decoder=_map_to_words(p.decoder), cross=cross, gates=p.gates)


_TO_WORDS = {AttentionMap: _map_to_words, CrossAttentionMap: _cross_to_words, Seq2SeqAttention: _seq2seq_to_words,
             ImageCrossAttention: _image_cross_to_words, Units: _units_to_words}


def _union(units, unit: int) -> tuple[int, int]:
    spans = [units.spans[t] for t, u in enumerate(units.word_index) if u == unit]
    return min(a for a, _ in spans), max(b for _, b in spans)
