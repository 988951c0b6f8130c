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

from typing import TYPE_CHECKING, Iterable, Iterator, Protocol, Sequence

if TYPE_CHECKING:  # annotations only: torch is imported by the functions that compute with it
    import torch

from headscope.probe.blocks import Block, Buffers

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

    >>> import torch
    >>> hm = HeadMap(layer=0, head=2, n_tokens=3)
    >>> hm.consume(Block(0, (1, 2), 0, torch.tensor([[[1., 0, 0], [.5, .5, 0]], [[1., 0, 0], [0, 1., 0]]])))
    >>> hm.consume(Block(0, (1, 2), 2, torch.tensor([[[.2, .3, .5]], [[0., 0, 1]]])))
    >>> hm.result()
    tensor([[1., 0., 0.],
            [0., 1., 0.],
            [0., 0., 1.]])
    """

    def __init__(self, *, layer: int, head: int, n_tokens: int) -> None:
        import torch
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
    order (as `iter_blocks` gives them). Word blocks have `query_start` in words and keys over words;
    each holds only the words its rows' keys reach (`Block.banded`: a causal or sliding band of words).
    """
    import torch
    idx = torch.as_tensor(list(word_index), dtype=torch.long)
    n_units = int(idx.max()) + 1
    pieces = torch.bincount(idx, minlength=n_units)  # tokens per word
    last = torch.full((n_units,), -1, dtype=torch.long).scatter_reduce(0, idx, torch.arange(len(idx)), "amax")
    ordered = bool((idx[1:] >= idx[:-1]).all()) and bool((idx[1:] - idx[:-1] <= 1).all()) and int(idx[0]) == 0
    scratch = torch.empty(0)  # the key sums of one block, reused: (H, R, words) written over each block
    buffers = Buffers()  # the word blocks given out, written over once the consumer has let go of them
    layer = None
    for block in blocks:
        if block.layer != layer:
            if layer is not None and done < n_units:
                raise ValueError(f"layer {layer}: its blocks stopped before word {done} was complete")
            # pending: [head, word done.., key] query sums of the words not given out yet, keys from word p_lo
            layer, done, pending, p_lo = block.layer, 0, None, 0
        band, lo = block.band, block.key_start  # the keys outside the band are exact zeros: left out
        H, R, K = band.shape
        words = idx[lo : lo + K]
        # the words this block's keys reach (in any order), and the first word pending rows need too
        start, reach = (int(words.min()), int(words.max()) + 1) if K else (0, 0)
        if pending is not None and pending.shape[1]:
            start = min(start, p_lo)
        width = max(reach - start, 0)
        if scratch.numel() < H * R * width or scratch.dtype != band.dtype or scratch.device != band.device:
            # room for every word at once: a causal band widens block after block, and a buffer grown each
            # time would cost its fresh pages each time
            scratch = band.new_empty(H * R * max(width, n_units))
        # keys of one word summed in token order; scatter_add_ is one vectorised pass where index_add_
        # (or a gather) over the last axis loops over the keys
        keys = scratch[: H * R * width].view(H, R, width).zero_().scatter_add_(
            -1, (words - start).to(band.device).expand(H, R, -1), band)  # (H, R, words start .. reach - 1)
        units = idx[block.query_start : block.query_stop]
        pending = _fold_rows(pending, p_lo, keys, start, units, done, ordered, buffers, n_units)
        p_lo = start
        unfinished = (last[done:] >= block.query_stop).nonzero()  # words whose last piece is yet to come
        ready = done + int(unfinished[0]) if len(unfinished) else n_units
        if ready > done:
            k = ready - done
            out = pending[:, :k]  # rows given out, never written again: normalised in place
            out.div_(pieces[done:ready, None].to(out))
            yield Block.banded(layer, block.heads, done, out, key_start=start, n_keys=n_units)
            pending, done = pending[:, k:], ready
    if layer is not None and done < n_units:
        raise ValueError(f"layer {layer}: its blocks stopped before word {done} was complete")


def _fold_rows(pending: torch.Tensor | None, p_lo: int, keys: torch.Tensor, start: int, units: torch.Tensor,
               done: int, ordered: bool, buffers: Buffers, n_units: int) -> torch.Tensor:
    """Query sums `[head, word done.., key start ..]`: `pending`'s (words done.., keys from `p_lo` >= `start`;
    or None) with the token rows `keys[head, row, word start ..]` of words `units` added, each word's rows
    in row order (0 + r1 + r2 ...)."""
    H, R, width = keys.shape
    have = 0 if pending is None else pending.shape[1]
    p_stop = p_lo + pending.shape[-1] - start if have else 0  # pending's keys, in this block's numbering
    first = int(units[0]) if R else done
    if ordered and R and first == done and have <= 1 and p_stop <= width:
        # words in order, one after another: only the last word of a block can be unfinished, and the next
        # block's first row goes on with it. Every row is added to its word's zeroed sum in row order (one
        # pass; a word's first row lands on 0 exactly), after the pending word's earlier rows.
        out = buffers.take((H, int(units[-1]) - first + 1, width), keys, at_least=H * R * n_units).zero_()
        if have:  # the word left pending goes on here: its earlier rows come first
            out[:, 0, p_lo - start : p_stop] = pending[:, 0]
        out.index_add_(1, units - first, keys)  # (H, words, keys)
        return out
    # any order (a special token given the last unit): the general fold, every row over the same keys
    top = int(units.max()) + 1 if R else done
    grown = keys.new_zeros(H, max(top - done, have), max(width, p_stop))
    if have:
        grown[:, :have, p_lo - start : p_stop] = pending
    grown[..., :width].index_add_(1, (units - done).to(keys.device), keys)
    return grown
