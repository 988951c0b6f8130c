"""What an attention source yields: a `Reading`, folded layer by layer or collected into maps.

An attention source (`probe.sources`) obtains attention in one of three forms, and says which in the reading
it yields, never in a type of its own that a consumer would have to test for:

    "layers"   a padded batch of texts whose forward pass is still to run: `run(each)` hands each layer's
               `(item, head, query, key)` weights, padding zeroed, to `each(i, a)` as the pass gives them
               (one layer of the batch alive at a time); `collect()`: the whole `AttentionBatch`
    "blocks"   one item's token-level blocks of query rows, recomputed from scratch layer by layer
               (`probe.recompute.Block`): no `[layer, head, T, T]` tensor exists
    "maps"     whole `AttentionMap`s (norm-based weights, images, texts with images, encoder–decoder pairs)

A consumer folds every reading the same way, `reading.fold(into)`, with a `Fold`: `map(amap)` alone collects
every reading into whole maps; `layers(reading)` and `blocks(reading, blocks)` fold the other forms as they
come (their defaults collect them). `reading.maps()` collects any reading into its maps.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Callable, Iterator, Literal, Mapping

import torch

from .names import Mode
from .types import AttentionBatch, AttentionMap, Units

__all__ = ["Reading", "Fold", "Form"]

Form = Literal["layers", "blocks", "maps"]


class Fold:
    """How a consumer reads `Reading`s: override `map`, and `layers` / `blocks` to fold those forms as they come
    (by default they are collected into maps first)."""

    def map(self, amap: AttentionMap) -> None:
        """One item's whole map."""
        raise NotImplementedError

    def layers(self, reading: "Reading") -> None:
        """A padded batch, its layers to come one at a time (`reading.run(each)`)."""
        for amap in reading.maps():
            self.map(amap)

    def blocks(self, reading: "Reading", blocks: Iterator) -> None:
        """One item's token-level blocks of query rows, layer by layer, each layer's rows in order."""
        for amap in reading.maps():
            self.map(amap)


@dataclass(frozen=True, eq=False)
class Reading:
    """The attention of one or more items (texts, images, pairs, token-id sequences) from one source, read once.

    `units` (one per item: token level for "layers" and "blocks"), `causal`, the model `layers` and `heads` it
    covers, `mode` (how the source obtained it: "eager" or "recompute") and `form` (module docstring). Made by
    the source (`of_maps`, `of_layers`, `of_blocks`), never by a consumer."""

    units: tuple[Units, ...]
    causal: bool
    layers: tuple[int, ...]
    heads: tuple[int, ...]
    mode: Mode
    form: Form
    collect_maps: Callable[[], list] = field(repr=False)  # the items' whole maps
    run: Callable[[Callable[[int, torch.Tensor], None]], None] | None = field(default=None, repr=False)  # "layers"
    make_blocks: Callable[[], Iterator] | None = field(default=None, repr=False)  # "blocks"
    n_tokens: int = 0  # "layers": the padded length
    meta: dict = field(default_factory=dict)
    no_attention: tuple[int, ...] = ()  # a hybrid stack's layers without softmax attention

    def __len__(self) -> int:
        return len(self.units)

    def fold(self, into: Fold) -> None:
        """Hand this reading to `into` in its form (`Fold.map` for each map, `Fold.layers`, `Fold.blocks`)."""
        _FOLDS[self.form](self, into)

    def maps(self) -> list:
        """The items' whole maps (`AttentionMap`s; a `Seq2SeqAttention` per pair)."""
        return self.collect_maps()

    def collect(self) -> AttentionBatch:
        """A "layers" reading's padded batch with every layer's attention at once (runs the forward pass)."""
        if self.run is None:
            raise ValueError(f"a {self.form!r} reading has no padded batch; read its maps() instead")
        att: list[torch.Tensor | None] = [None] * len(self.layers)
        self.run(att.__setitem__)
        return AttentionBatch(units=self.units, attention=tuple(att), causal=self.causal, layers=self.layers,
                              heads=self.heads, meta=dict(self.meta), no_attention=self.no_attention)

    @classmethod
    def of_maps(cls, maps: list, *, mode: Mode = "eager") -> "Reading":
        """Whole maps already obtained (one reading per map: each item folds on its own)."""
        head = _head(maps[0])
        return cls(units=tuple(Units.of(_head(m)) for m in maps), causal=head.causal,
                   layers=tuple(head.layer_ids), heads=tuple(head.head_ids), mode=mode, form="maps",
                   collect_maps=lambda: list(maps), meta=dict(head.meta), no_attention=head.no_attention)

    @classmethod
    def of_layers(cls, *, units: tuple[Units, ...], causal: bool, layers: tuple[int, ...], heads: tuple[int, ...],
                  n_tokens: int, run, collect_maps, meta: dict, no_attention: tuple[int, ...]) -> "Reading":
        return cls(units=units, causal=causal, layers=layers, heads=heads, mode="eager", form="layers",
                   collect_maps=collect_maps, run=run, n_tokens=n_tokens, meta=meta, no_attention=no_attention)

    @classmethod
    def of_blocks(cls, *, units: Units, causal: bool, layers: tuple[int, ...], heads: tuple[int, ...],
                  make_blocks, collect_maps) -> "Reading":
        return cls(units=(units,), causal=causal, layers=layers, heads=heads, mode="recompute", form="blocks",
                   collect_maps=collect_maps, make_blocks=make_blocks)


def _head(item):
    """The self-attention map that names an item's grid: an encoder–decoder pair's encoder map, a cross-attention
    reader's decoder map (`ImageCrossAttention`), a map itself."""
    for part in ("encoder", "decoder"):
        if hasattr(item, part) and hasattr(item, "cross"):
            return getattr(item, part)
    return item


def _fold_maps(reading: Reading, into: Fold) -> None:
    for amap in reading.maps():
        into.map(amap)


_FOLDS: Mapping[Form, Callable[[Reading, Fold], None]] = MappingProxyType({
    "maps": _fold_maps,
    "layers": lambda reading, into: into.layers(reading),
    "blocks": lambda reading, into: into.blocks(reading, reading.make_blocks()),
})
