"""One text on one model, held for a viewer: any head's query rows, computed when asked for.

The live explorer (`headscope serve`) asks for one head at a time: a few query rows in view, or every
row once, block by block, to pool an overview (`analyses.pooled`). A `LiveText` is what an attention
source (`probe.sources`) gives for one text, `source.live(text, level=..., weight=...)`, each source in
its own way:

- `EagerLive`: the text's whole `[layer, head, query, key]` map, extracted once (at the level and weight
  asked for), and rows sliced from it;
- `RecomputedLive`: the wanted layer's input `x` (T, D) caught under fast attention, then only the asked
  rows recomputed from scratch (`probe.recompute`): no T × T tensor exists for a long text. The forward
  pass runs only as far as the layer asked for and waits there (`probe.recompute.streamed_inputs`): the
  first view of layer L costs the layers up to L, a later layer continues the same pass. Every input it
  passes is written to a temporary folder of the text's own (removed with the text) and the last
  `keep_layers` stay in memory, so a zoom into any layer already passed is seconds, and memory holds a
  few layers, not all of them. The source's first recomputed text is checked against the model's eager
  attention on its prefix, as everywhere else.

Both check what they are asked for (layer, head, rows) the same way, here.
"""

from __future__ import annotations

import shutil
import tempfile
import weakref
from pathlib import Path
from typing import Iterable, Iterator, Protocol

import torch

from .encoding import Encoded
from .families import Family, family_for
from .forward import attention_layers, base_model, no_attention_reason
from .lru import LRU
from .model import LoadedModel
from .names import Mode
from .recompute import Block, PrefixCheck, fast_attention, layer_blocks, streamed_inputs
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
        self._caught = _Caught(lm, self.family, enc, self.attention_layers)
        weakref.finalize(self, _Caught.close, self._caught)  # the waiting pass and the folder go with the text

    def close(self) -> None:
        """End the waiting forward pass and remove the layer inputs' folder now, not when the text is dropped
        (the text still answers afterwards: it catches what it needs again)."""
        self._inputs = LRU(self._inputs.size)
        self._caught.close()

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
        """The layer's input (T, D): from memory (the last `keep_layers` asked for), else read back from the
        text's folder, else caught by the forward pass, which runs on to this layer and waits there."""
        if layer not in self._inputs:
            self._inputs[layer] = self._caught.read(layer)
        return self._inputs[layer]


class _Caught:
    """One text's layer inputs: the forward pass that catches them, paused in the last layer it reached, and
    the inputs it passed on the way, each in a file of a temporary folder of its own. Holds no reference to
    its live text, so that the text's finalizer can close it."""

    def __init__(self, lm: LoadedModel, family: Family, enc: Encoded, layers: Iterable[int]) -> None:
        self.lm, self.family, self.enc, self.layers = lm, family, enc, sorted(layers)
        self.stream: Iterator[tuple[int, torch.Tensor]] | None = None
        self.at = -1  # the layer the paused pass waits in
        self.folder: Path | None = None
        self.files: dict[int, Path] = {}
        self.spill = True  # False once the folder cannot be written: a layer passed is then caught again

    def read(self, layer: int) -> torch.Tensor:
        if layer in self.files:
            return torch.load(self.files[layer], weights_only=True)
        if self.stream is None or layer <= self.at:  # a layer passed and not kept: the pass starts again
            self._end()
            self.stream = streamed_inputs(self.lm, self.family, [self.enc], self.layers)
        n = len(self.enc.ids)
        try:  # the pass runs only in here, with fast attention; while it waits, the model is as it was loaded
            with fast_attention(self.lm.model):
                for i, x in self.stream:
                    self.at = i
                    x = x[0, :n]
                    self._write(i, x)
                    if i == layer:
                        return x
            raise RuntimeError(f"the forward pass of {self.lm.name} ended before layer {layer}")
        except BaseException:  # a failed or interrupted pass is not resumed: the next read starts a new one
            self._end()
            raise

    def _write(self, layer: int, x: torch.Tensor) -> None:
        if not self.spill or layer in self.files:
            return
        try:
            if self.folder is None:
                self.folder = Path(tempfile.mkdtemp(prefix="headscope-layers-"))
            path = self.folder / f"layer{layer}.pt"
            torch.save(x.clone(), path)
        except OSError:  # no room on disk: keep nothing there; a later layer passed is caught again
            self.spill = False
            return
        self.files[layer] = path

    def _end(self) -> None:
        stream, self.stream, self.at = self.stream, None, -1
        if stream is not None:
            stream.close()  # the waiting pass ends where it is

    def close(self) -> None:
        self._end()
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder, self.files = None, {}
