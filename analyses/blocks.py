"""Consumers of attention blocks: reduce each block of query rows as it comes, never a whole text.

`probe.recompute.iter_blocks` hands over `Block(layer, heads, query_start, probs[head, query, key])`
for some query rows at a time. What the analyses need from a map is row-wise, so it folds block by
block:

- `HeadMap`: one head's full `[query, key]` map, filled from blocks (a heatmap of one head).
- `word_blocks`: word-level blocks (Clark et al. 2019: sum over key pieces, mean over query pieces),
  exact across block edges: a word whose pieces straddle two blocks is held back, its partial query
  sum carried, until its last piece has come.

The head metrics themselves fold blocks in `analyses.heads.HeadScoreAccumulator.update_blocks`, with
the very computation that scores whole maps (`analyses.metrics.METRICS`). Nothing here touches a model.
"""

from __future__ import annotations

from typing import Iterable, Iterator, Protocol, Sequence

import torch

from headscope.probe.recompute import Block

__all__ = ["BlockConsumer", "feed", "HeadMap", "word_blocks"]


class BlockConsumer(Protocol):
    """Anything that folds blocks in: `consume(block)` per block, in the order they come."""

    def consume(self, block: Block) -> None: ...


def feed(blocks: Iterable[Block], *consumers: BlockConsumer) -> None:
    """Hand every block to every consumer, one block alive at a time."""
    for block in blocks:
        for c in consumers:
            c.consume(block)


class HeadMap:
    """The full `[query, key]` map of one head of one layer, assembled from blocks.

    >>> hm = HeadMap(layer=0, head=2, n_tokens=3)
    >>> hm.consume(Block(0, (1, 2), 0, torch.tensor([[[1., 0, 0], [.5, .5, 0]], [[1., 0, 0], [0, 1., 0]]])))
    >>> hm.consume(Block(0, (1, 2), 2, torch.tensor([[[.2, .3, .5]], [[0., 0, 1]]])))
    >>> hm.result()
    tensor([[1., 0., 0.],
            [0., 1., 0.],
            [0., 0., 1.]])
    """

    def __init__(self, *, layer: int, head: int, n_tokens: int) -> None:
        self.layer, self.head = int(layer), int(head)
        self._map = torch.zeros(n_tokens, n_tokens)  # [query, key]
        self._filled = torch.zeros(n_tokens, dtype=torch.bool)

    def consume(self, block: Block) -> None:
        if block.layer != self.layer or self.head not in block.heads:
            return
        h = block.heads.index(self.head)
        self._map[block.query_start : block.query_stop] = block.probs[h].to(self._map.dtype)
        self._filled[block.query_start : block.query_stop] = True

    def result(self) -> torch.Tensor:
        missing = (~self._filled).nonzero().flatten().tolist()
        if missing:
            raise ValueError(f"L{self.layer}H{self.head}: no block gave query rows {missing[:5]}{' …' if len(missing) > 5 else ''}")
        return self._map.clone()


def word_blocks(blocks: Iterable[Block], word_index: Sequence[int]) -> Iterator[Block]:
    """Word-level blocks from token-level ones: keys summed over a word's pieces, queries averaged.

    `word_index[t]` is the word unit of token t (an `AttentionMap`'s `word_index`). A word is given out
    once its last piece has been seen, with every earlier word; blocks of a layer must come in row
    order (as `iter_blocks` gives them). Word blocks have `query_start` in words and keys over words.
    """
    idx = torch.as_tensor(list(word_index), dtype=torch.long)
    n_units = int(idx.max()) + 1
    pieces = torch.bincount(idx, minlength=n_units)  # tokens per word
    last = torch.full((n_units,), -1, dtype=torch.long).scatter_reduce(0, idx, torch.arange(len(idx)), "amax")
    layer = None
    for block in blocks:
        if block.layer != layer:
            if layer is not None and done < n_units:
                raise ValueError(f"layer {layer}: its blocks stopped before word {done} was complete")
            layer, done, pending, key_stop = block.layer, 0, None, 0  # pending: [head, word done.., word] query sums
        band, lo = block.band, block.key_start  # the keys outside the band are exact zeros: left out
        H, R, K = band.shape
        # keys of one word summed in token order; scatter_add_ is one vectorised pass where index_add_
        # over the last axis loops over the T keys
        reach = int(idx[lo : lo + K].max()) + 1 if K else 0  # the words this block's keys reach (in any order)
        keys = band.new_zeros(H, R, reach).scatter_add_(-1, idx[lo : lo + K].to(band.device).expand(H, R, -1),
                                                        band)  # (H, R, words up to reach)
        key_stop = max(key_stop, reach)  # the words the layer's rows reach so far: zeros beyond
        units = idx[block.query_start : block.query_stop]
        top = int(units.max()) + 1
        if pending is None or pending.shape[1] < top - done:
            grown = keys.new_zeros(keys.shape[0], top - done, n_units)
            if pending is not None:
                grown[:, : pending.shape[1]] = pending
            pending = grown
        pending[..., :reach].index_add_(1, (units - done).to(keys.device), keys)
        unfinished = (last[done:] >= block.query_stop).nonzero()  # words whose last piece is yet to come
        ready = done + int(unfinished[0]) if len(unfinished) else n_units
        if ready > done:
            k = ready - done
            out = pending[:, :k]  # rows given out, never written again: normalised in place, the band only
            out[..., :key_stop].div_(pieces[done:ready, None].to(out))
            yield Block(layer, block.heads, done, out, key_stop=key_stop)
            pending, done = pending[:, k:], ready
    if layer is not None and done < n_units:
        raise ValueError(f"layer {layer}: its blocks stopped before word {done} was complete")
