"""One text on one model, held for a viewer: any head's query rows, computed when asked for.

The live explorer (`headscope serve`) asks for one head at a time: a few query rows in view, or every
row once, block by block, to pool an overview (`analyses.pooled`). A `LiveText` is what an attention
source (`probe.sources`) gives for one text, `source.live(text, level=..., weight=...)`, each source in
its own way:

- `EagerLive`: the text's whole `[layer, head, query, key]` map, extracted once (at the level and weight
  asked for), and rows sliced from it;
- `RecomputedLive`: the wanted layer's input `x` (T, D) caught once under fast attention and kept (the
  last `keep_layers` layers), then only the asked rows recomputed from scratch (`probe.recompute`): no
  T × T tensor exists for a long text. The source's first recomputed text is checked against the
  model's eager attention on its prefix, as everywhere else.

Both check what they are asked for (layer, head, rows) the same way, here.
"""

from __future__ import annotations

from typing import Iterator, Protocol

import torch

from .encoding import Encoded
from .families import family_for
from .forward import attention_layers, base_model, no_attention_reason
from .lru import LRU
from .model import LoadedModel
from .names import Mode
from .recompute import Block, PrefixCheck, layer_blocks, layer_inputs
from .types import AttentionMap, Units

__all__ = ["LiveText", "EagerLive", "RecomputedLive"]


class Checked(Protocol):
    """What a live text needs of its attention source (`probe.sources.AttentionSource`)."""

    budget: int
    block_budget: int
    check: PrefixCheck | None

    def checked(self, enc: Encoded) -> PrefixCheck: ...


class LiveText:
    """`rows(layer, head, start, stop)` and `blocks(layer, head)` of one text, `mode` saying how they are obtained.

    >>> from headscope.probe.tiny import tiny_model
    >>> from headscope.probe.sources import source_for
    >>> lm = tiny_model("gpt2")
    >>> live = source_for(lm, "recompute").live("The cat sat on the mat.")
    >>> live.mode, len(live), tuple(live.rows(1, 0, 2, 4).shape)
    ('recompute', 7, (2, 7))
    """

    mode: Mode

    def __init__(self, lm: LoadedModel, source: Checked, units: Units) -> None:
        self.lm, self.source, self.units = lm, source, units
        self.n_layers, self.n_heads = lm.config.num_hidden_layers, lm.config.num_attention_heads
        self.attention_layers = attention_layers(lm)  # a hybrid stack's softmax layers

    def __len__(self) -> int:
        return len(self.units.labels)

    @property
    def labels(self) -> tuple[str, ...]:
        return self.units.labels

    @property
    def check(self) -> dict | None:
        """The source's prefix check of its recomputation (None while it has recomputed nothing)."""
        return None if self.source.check is None else self.source.check.to_dict()

    def rows(self, layer: int, head: int, start: int, stop: int) -> torch.Tensor:
        """Query rows start .. stop - 1 of head `layer`.`head`: (stop - start, keys), a new tensor."""
        self._check_head(layer, head)
        n = len(self)
        if not (isinstance(start, int) and isinstance(stop, int) and 0 <= start < stop <= n):
            raise ValueError(f"rows [{start}, {stop}] are outside the text: rows must be [start, stop] with "
                             f"0 <= start < stop <= {n}")
        return self._rows(layer, head, start, stop)

    def blocks(self, layer: int, head: int) -> Iterator[Block]:
        """Every query row of the head, as blocks of rows in order (one block alive at a time)."""
        self._check_head(layer, head)
        return self._blocks(layer, head)

    def _check_head(self, layer: int, head: int) -> None:
        for what, v, n in (("layer", layer, self.n_layers), ("head", head, self.n_heads)):
            if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < n:
                raise ValueError(f"{what} must be 0..{n - 1} for {self.lm.name}, got {v!r}")
        if layer not in self.attention_layers:
            raise ValueError(no_attention_reason(self.lm, layer))

    def _rows(self, layer: int, head: int, start: int, stop: int) -> torch.Tensor:
        raise NotImplementedError

    def _blocks(self, layer: int, head: int) -> Iterator[Block]:
        raise NotImplementedError


class EagerLive(LiveText):
    """Rows sliced from the text's whole map (`amap`, extracted once)."""

    mode = "eager"

    def __init__(self, lm: LoadedModel, source: Checked, amap: AttentionMap) -> None:
        super().__init__(lm, source, Units.of(amap))
        self.map = amap

    def _rows(self, layer: int, head: int, start: int, stop: int) -> torch.Tensor:
        return self.map.attention[self._layer_index(layer), head, start:stop].float().clone()

    def _blocks(self, layer: int, head: int) -> Iterator[Block]:
        a = self.map.attention[self._layer_index(layer), head].float()  # (query, key)
        yield Block(layer, (head,), 0, a[None].clone())

    def _layer_index(self, layer: int) -> int:
        ids = list(self.map.layer_ids)
        if layer not in ids:
            raise ValueError(f"layer {layer} has no attention map; layers {ids} have")
        return ids.index(layer)


class RecomputedLive(LiveText):
    """Rows recomputed from scratch from the layer's caught input (`enc`: the text, token level)."""

    mode = "recompute"

    def __init__(self, lm: LoadedModel, source: Checked, enc: Encoded, units: Units, *, keep_layers: int = 4) -> None:
        super().__init__(lm, source, units)
        self.enc, self.family = enc, family_for(lm.config)
        self._inputs: LRU[int, torch.Tensor] = LRU(keep_layers)

    def _rows(self, layer: int, head: int, start: int, stop: int) -> torch.Tensor:
        return torch.cat([b.probs[0].float() for b in self._recomputed(layer, head, (start, stop))], dim=0)

    def _blocks(self, layer: int, head: int) -> Iterator[Block]:
        return self._recomputed(layer, head, None)

    def _recomputed(self, layer: int, head: int, rows: tuple[int, int] | None) -> Iterator[Block]:
        self.source.checked(self.enc)
        x = self._input(layer)
        spec = self.family.layer_spec(base_model(self.lm), layer, self.lm.config)
        kv = None if spec.kv_layer is None else self._input(spec.kv_layer)  # shared KV: the producer layer's input
        with torch.inference_mode():
            yield from layer_blocks(x, spec, layer, [head], self.source.block_budget, kv=kv, rows=rows)

    def _input(self, layer: int) -> torch.Tensor:
        """The layer's input (T, D). The first forward pass catches every layer's input when they all fit in
        a quarter of the source's budget (a zoom into another layer is then seconds, not another forward
        pass over a long text), else only this layer's; the last `keep_layers` asked for stay."""
        if layer in self._inputs:
            return self._inputs[layer]
        T, D = len(self.enc.ids), self.lm.config.hidden_size
        itemsize = torch.empty((), dtype=self.lm.dtype).element_size()
        have = self.attention_layers
        every = not self._inputs and len(have) * T * D * itemsize <= self.source.budget // 4
        wanted = list(have) if every else [layer]
        caught = layer_inputs(self.lm, self.family, [self.enc], wanted)
        if every:
            self._inputs.size = max(self._inputs.size, len(have))
        for i in wanted:
            self._inputs[i] = caught[i][0]
        return self._inputs[layer]
