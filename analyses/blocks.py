"""Consumers of attention blocks: reduce each block of query rows as it comes, never a whole text.

`probe.recompute.iter_blocks` hands over `Block(layer, heads, query_start, probs[head, query, key])`
for some query rows at a time. What the analyses need from a map is row-wise, so it folds block by
block:

- `HeadMap`: one head's full `[query, key]` map, filled from blocks (a heatmap of one head).
- `word_blocks`: word-level blocks (Clark et al. 2019: sum over key pieces, mean over query pieces),
  exact across block edges: a word whose pieces straddle two blocks is held back, its partial query
  sum carried, until its last piece has come.
- `row_quantities`: per query row, what the head metrics average — attention to the previous / same /
  next position, entropy, max weight, and the attention sums over key sets.

Nothing here touches a model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Iterator, Protocol, Sequence

import torch

from headscope.probe.recompute import Block

__all__ = ["BlockConsumer", "feed", "HeadMap", "word_blocks", "RowQuantities", "row_quantities"]


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
            layer, done, pending = block.layer, 0, None  # pending: [head, word done.., word] query sums
        H, R, _ = block.probs.shape
        # keys of one word summed in token order; scatter_add_ is one vectorised pass where index_add_
        # over the last axis loops over the T keys
        keys = block.probs.new_zeros(H, R, n_units).scatter_add_(-1, idx.to(block.probs.device).expand(H, R, -1),
                                                                 block.probs)  # (H, R, W)
        units = idx[block.query_start : block.query_stop]
        top = int(units.max()) + 1
        if pending is None or pending.shape[1] < top - done:
            grown = keys.new_zeros(keys.shape[0], top - done, n_units)
            if pending is not None:
                grown[:, : pending.shape[1]] = pending
            pending = grown
        pending.index_add_(1, (units - done).to(keys.device), keys)
        unfinished = (last[done:] >= block.query_stop).nonzero()  # words whose last piece is yet to come
        ready = done + int(unfinished[0]) if len(unfinished) else n_units
        if ready > done:
            k = ready - done
            yield Block(layer, block.heads, done, pending[:, :k] / pieces[done:ready, None].to(pending))
            pending, done = pending[:, k:], ready
    if layer is not None and done < n_units:
        raise ValueError(f"layer {layer}: its blocks stopped before word {done} was complete")


@dataclass(frozen=True, eq=False)
class RowQuantities:
    """Per query row of a block (`[head, row]`), what the head metrics average over rows.

    previous / self_ / next: `A[q, q-1]`, `A[q, q]`, `A[q, q+1]` (0 where the row has no such key);
    entropy: `-Σ_k A ln A` in nats; max_weight: `max_k A`; key_sets: `Σ_{k∈S} A[q, k]` per set,
    `[head, row, set]`.
    """

    previous: torch.Tensor
    self_: torch.Tensor
    next: torch.Tensor
    entropy: torch.Tensor
    max_weight: torch.Tensor
    key_sets: torch.Tensor | None


def row_quantities(block: Block, key_sets: torch.Tensor | None = None) -> RowQuantities:
    """The per-row quantities of one block; `key_sets` is a 0/1 `[key, set]` matrix (optional).

    >>> b = Block(0, (0,), 1, torch.tensor([[[0.5, 0.5, 0.0], [0.0, 0.25, 0.75]]]))  # queries 1 and 2
    >>> rq = row_quantities(b)
    >>> rq.previous.tolist(), rq.self_.tolist(), rq.next.tolist(), rq.max_weight.tolist()
    ([[0.5, 0.25]], [[0.5, 0.75]], [[0.0, 0.0]], [[0.5, 0.75]])
    """
    a = block.probs  # (H, R, T)
    R, T = a.shape[-2:]
    q = torch.arange(block.query_start, block.query_stop, device=a.device)  # each row's query position
    return RowQuantities(
        previous=_at_offset(a, q, -1),
        self_=_at_offset(a, q, 0),
        next=_at_offset(a, q, 1),
        entropy=_entropy(a),
        max_weight=a.amax(-1),
        key_sets=None if key_sets is None else a @ key_sets.to(a),
    )


def _entropy(a: torch.Tensor) -> torch.Tensor:
    """-Σ_k A ln A per row, (H, R): the head analyses' formula, 0·ln(tiny) = 0 standing in for 0·ln 0
    (masked keys), with its temporaries done in place in one buffer."""
    terms = a.clamp_min(torch.finfo(a.dtype).tiny).log_().mul_(a)  # A ln A
    return -terms.sum(-1)


def _at_offset(a: torch.Tensor, q: torch.Tensor, offset: int) -> torch.Tensor:
    """`a[h, r, q[r] + offset]` per row, 0 where that key is outside the text: (H, R)."""
    k = q + offset
    inside = (k >= 0) & (k < a.shape[-1])
    picked = a.gather(-1, k.clamp(0, a.shape[-1] - 1).expand(a.shape[0], -1)[..., None])[..., 0]
    return picked * inside
