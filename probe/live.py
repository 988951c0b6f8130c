"""One text on one model, held for a viewer: any head's query rows, computed when asked for.

The live explorer (`headscope serve`) asks for one head at a time: a few query rows in view, or every
row once, block by block, to pool an overview (`analyses.pooled`). `LiveText` answers from the
model's attention source (`probe.sources`):

- eager: the text's whole `[layer, head, query, key]` map, extracted once (`extract`, at the level
  and weight asked for), and rows sliced from it;
- recompute: the wanted layer's input `x` (T, D) caught once under fast attention and kept (the last
  `keep_layers` layers), then only the asked rows recomputed from scratch (`probe.recompute`): no
  T × T tensor exists for a long text. The source's first recomputed text is checked against the
  model's eager attention on its prefix, as everywhere else.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Iterator

import torch

from .encoding import encode, text_units
from .extract import extract
from .families import family_for
from .forward import base_model, no_attention_reason
from .model import LoadedModel
from .names import Level, Weight
from .recompute import Block, _layer_blocks, layer_inputs
from .sources import AttentionSource
from .types import AttentionMap, Units

__all__ = ["LiveText"]


class LiveText:
    """`text` on `lm` through `source`: `rows(layer, head, start, stop)` and `blocks(layer, head)`.

    >>> from headscope.probe.tiny import tiny_model
    >>> from headscope.probe.sources import source_for
    >>> lm = tiny_model("gpt2")
    >>> live = LiveText(lm, "The cat sat on the mat.", source_for(lm, "recompute"))
    >>> live.mode, len(live), tuple(live.rows(1, 0, 2, 4).shape)
    ('recompute', 7, (2, 7))
    """

    def __init__(self, lm: LoadedModel, text: str, source: AttentionSource, *, level: Level = "token",
                 weight: Weight = "attention", keep_layers: int = 4) -> None:
        if level not in ("token", "word"):
            raise ValueError(f"level must be 'token' or 'word', got {level!r}")
        if weight not in ("attention", "norm"):
            raise ValueError(f"weight must be 'attention' or 'norm', got {weight!r}")
        self.lm, self.source, self.level, self.weight = lm, source, level, weight
        self.enc = encode(lm, text)
        n = len(self.enc.ids)
        self.mode = source.mode(n)
        if weight == "norm" and self.mode == "recompute":
            raise ValueError("weight='norm' comes from the eager forward pass; this text is recomputed "
                             "(use weight='attention', or attention='eager' with a larger memory budget)")
        if level == "word" and self.mode == "recompute":
            raise ValueError(f"this text has {n:,} tokens and is recomputed in blocks of rows, which are "
                             "token rows: use level='token'")
        self._map: AttentionMap | None = None
        self._inputs: OrderedDict[int, torch.Tensor] = OrderedDict()
        self._keep = max(1, keep_layers)
        if self.mode == "eager":
            [self._map] = extract(lm, text, level=level, weight=weight)
            self.units = Units.of(self._map)
        else:
            self.units = text_units(lm, self.enc)
        self.family = family_for(lm.config)
        self.n_layers = lm.config.num_hidden_layers
        self.attention_layers = tuple(self.family.attention_layers(lm.config))  # a hybrid stack's softmax layers
        self.n_heads = lm.config.num_attention_heads

    def __len__(self) -> int:
        return len(self.units.labels)

    @property
    def labels(self) -> tuple[str, ...]:
        return self.units.labels

    @property
    def check(self) -> dict | None:
        """The recomputation's prefix check (None in eager mode or before the first recomputed rows)."""
        return None if self.source.check is None else self.source.check.to_dict()

    def _check_head(self, layer: int, head: int) -> None:
        for what, v, n in (("layer", layer, self.n_layers), ("head", head, self.n_heads)):
            if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < n:
                raise ValueError(f"{what} must be 0..{n - 1} for {self.lm.name}, got {v!r}")
        if layer not in self.attention_layers:
            raise ValueError(no_attention_reason(self.lm, layer))

    def rows(self, layer: int, head: int, start: int, stop: int) -> torch.Tensor:
        """Query rows start .. stop - 1 of head `layer`.`head`: (stop - start, keys), a new tensor."""
        self._check_head(layer, head)
        n = len(self)
        if not (isinstance(start, int) and isinstance(stop, int) and 0 <= start < stop <= n):
            raise ValueError(f"rows must be [start, stop] with 0 <= start < stop <= {n}, got [{start}, {stop}]")
        if self._map is not None:
            return self._map.attention[self._layer_index(layer), head, start:stop].float().clone()
        return torch.cat([b.probs[0].float() for b in self._recomputed(layer, head, (start, stop))], dim=0)

    def blocks(self, layer: int, head: int) -> Iterator[Block]:
        """Every query row of the head, as blocks of rows in order (one block alive at a time)."""
        self._check_head(layer, head)
        if self._map is not None:
            a = self._map.attention[self._layer_index(layer), head].float()  # (query, key)
            yield Block(layer, (head,), 0, a[None].clone())
            return
        yield from self._recomputed(layer, head, None)

    def _layer_index(self, layer: int) -> int:
        ids = list(self._map.layer_ids)
        if layer not in ids:
            raise ValueError(f"layer {layer} has no attention map; layers {ids} have")
        return ids.index(layer)

    def _recomputed(self, layer: int, head: int, rows: tuple[int, int] | None) -> Iterator[Block]:
        self.source.checked(self.enc)
        x = self._input(layer)
        spec = self.family.layer_spec(base_model(self.lm), layer, self.lm.config)
        kv = None if spec.kv_layer is None else self._input(spec.kv_layer)  # shared KV: the producer layer's input
        with torch.inference_mode():
            yield from _layer_blocks(x, spec, layer, [head], self.source.block_budget, kv=kv, rows=rows)

    def _input(self, layer: int) -> torch.Tensor:
        """The layer's input (T, D). The first forward pass catches every layer's input when they all fit in
        a quarter of the source's budget (a zoom into another layer is then seconds, not another forward
        pass over a long text), else only this layer's; the last `keep_layers` asked for stay."""
        if layer in self._inputs:
            self._inputs.move_to_end(layer)
            return self._inputs[layer]
        T, D = len(self.enc.ids), self.lm.config.hidden_size
        itemsize = torch.empty((), dtype=self.lm.dtype).element_size()
        have = self.attention_layers
        every = not self._inputs and len(have) * T * D * itemsize <= self.source.budget // 4
        wanted = list(have) if every else [layer]
        caught = layer_inputs(self.lm, self.family, [self.enc], wanted)
        if every:
            self._keep = max(self._keep, len(have))
        for i in wanted:
            self._inputs[i] = caught[i][0]
        self._inputs.move_to_end(layer)
        while len(self._inputs) > self._keep:
            self._inputs.popitem(last=False)
        return self._inputs[layer]
