"""What every attention map is made of, whichever way its attention was obtained.

Eager extraction (`probe.extract`), recomputation in blocks (`probe.recompute`), the attention sources
(`probe.sources`) and the live explorer's texts (`probe.live`) all build on the same pieces:

    select_layers(lm, layers)      the chosen layers (default: every layer with softmax attention)
    select_heads(lm, heads)        the chosen heads (default: all)
    select_indices(chosen, n, what)  a checked, sorted, de-duplicated list of indices 0..n-1
    kept_ids(lm, layers, heads)    what a map's `layers` / `heads` say about a selection (empty: all)
    MapFacts.of(lm)                what every map of a model carries besides its text and attention
    make_map(lm, enc, attention)   one encoded text and its [layer, head, query, key] tensor as an `AttentionMap`
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Sequence

from .encoding import Encoded, text_units
from .forward import attention_layers, learned_sinks, no_attention_layers, no_attention_reason
from .model import LoadedModel
from .types import AttentionMap, whole_number
from .vision_language import sees_ahead
from .words import Segmenter

__all__ = ["select_layers", "select_heads", "select_indices", "kept_ids", "MapFacts", "make_map"]


def select_layers(lm: LoadedModel, layers: Sequence[int] | None) -> list[int]:
    """The chosen layers (by default every layer with softmax attention); a hybrid model's layers without
    attention are refused by name.

    >>> from headscope.probe.tiny import tiny_model
    >>> select_layers(tiny_model("gpt2"), None), select_layers(tiny_model("gpt2"), [1, 1])
    ([0, 1], [1])
    """
    have = attention_layers(lm)
    chosen = select_indices(list(have) if layers is None else layers, lm.config.num_hidden_layers, "layer")
    for layer in chosen:
        if layer not in have:
            raise ValueError(no_attention_reason(lm, layer))
    return chosen


def select_heads(lm: LoadedModel, heads: Sequence[int] | None) -> list[int]:
    """The chosen heads of every chosen layer (by default all of them)."""
    return select_indices(heads, lm.config.num_attention_heads, "head")


def select_indices(chosen: Sequence[int] | None, n: int, what: str) -> list[int]:
    """`chosen` as sorted, distinct whole numbers in 0..n - 1 (None: all of them); `what` names them in errors.

    >>> select_indices([2, 0, 2], 3, "head"), select_indices(None, 2, "layer")
    ([0, 2], [0, 1])
    """
    if chosen is None:
        return list(range(n))
    if isinstance(chosen, (str, bytes)) or not isinstance(chosen, Iterable):
        raise TypeError(f"{what}s must be a list of {what} indices such as [0, 2] (or None for all), got {chosen!r}")
    out = sorted({whole_number(c, f"{what} index", minimum=None) for c in chosen})
    if not out:
        raise ValueError(f"{what}s is empty; pass None for all {what}s or a list such as [0, 2] "
                         f"(the model has {what}s 0..{n - 1})")
    bad = [c for c in out if not 0 <= c < n]
    if bad:
        raise ValueError(f"{what}s {bad} out of range: the model has {what}s 0..{n - 1}")
    return out


def kept_ids(lm: LoadedModel, layer_idx: Sequence[int], head_idx: Sequence[int]) -> tuple[tuple[int, ...],
                                                                                           tuple[int, ...]]:
    """A map's `layers` and `heads` for the selected layers and heads: empty where the selection is all of them."""
    all_layers = len(layer_idx) == lm.config.num_hidden_layers
    all_heads = len(head_idx) == lm.config.num_attention_heads
    return () if all_layers else tuple(layer_idx), () if all_heads else tuple(head_idx)


@dataclass(frozen=True)
class MapFacts:
    """What every map of a model carries besides its text and attention, read off the model once per run of
    texts (`learned_sinks` walks every parameter's name)."""

    meta: dict = field(default_factory=dict)  # copied into each map's `meta`
    sinks: bool = False
    no_attention: tuple[int, ...] = ()

    @classmethod
    def of(cls, lm: LoadedModel) -> MapFacts:
        return cls(meta={"model": lm.name, "dtype": str(lm.dtype).replace("torch.", "")}, sinks=learned_sinks(lm),
                   no_attention=no_attention_layers(lm))


def make_map(lm: LoadedModel, enc: Encoded, attention, *, segmenter: Segmenter | None = None,
             layers: tuple[int, ...] = (), heads: tuple[int, ...] = (), causal: bool | None = None,
             facts: MapFacts | None = None) -> AttentionMap:
    """The token-level `AttentionMap` of one encoded text (or image) and its `[layer, head, query, key]` tensor;
    `layers`/`heads` as `kept_ids` gives them; `facts` (`MapFacts.of(lm)`) spares a caller of many maps
    reading the model for each."""
    if enc.pixels is not None:  # an image: its units are the prefix tokens and the patches
        n = len(enc.labels)
        return AttentionMap(text=enc.text, level="token", labels=enc.labels, spans=enc.spans, special=enc.special,
                            attention=attention, causal=False, word_index=tuple(range(n)), word_spans=enc.spans,
                            layers=layers, heads=heads, grid=enc.grid, image=enc.picture,
                            meta={"model": lm.name, "dtype": str(lm.dtype).replace("torch.", ""), "image": enc.text})
    units = text_units(lm, enc, segmenter)
    facts = facts or MapFacts.of(lm)
    labels = units.labels  # a text with images: image tokens labelled by their cell (img0:r1c2), `token_labels`
    return AttentionMap(
        text=units.text,
        level="token",
        labels=labels,
        spans=units.spans,
        special=units.special,
        attention=attention,
        causal=(lm.is_causal and not sees_ahead(lm, enc)) if causal is None else causal,
        word_index=units.word_index,
        word_spans=units.word_spans,
        token_ids=units.token_ids,
        layers=layers,
        heads=heads,
        meta=dict(facts.meta),
        sinks=facts.sinks,
        no_attention=facts.no_attention,
        patches=enc.patches,
        pictures=enc.pictures,
    )
