"""One head's map in a size a page can hold: tiles pooled by max and mean, and each row's top keys.

A `[query, key]` map of a long text (T² weights: 16,384 tokens are 268 M of them) cannot go to a
browser. A viewer gets instead:

- `PooledMap`: the map cut into at most `tiles × tiles` tiles (tile i of T positions covers
  `i·T // n .. (i+1)·T // n - 1`), each with its **max** (a sharp diagonal or a sink column survives
  pooling) and its **mean** (the mass; masked cells count as zeros);
- `TopKeys`: per query row, its `k` largest keys and their weights.

Both are built from a whole map (`pool`, `top_keys`) or folded from a stream of row blocks as the
recompute engine gives them (`Pooler`, an `analyses.blocks.BlockConsumer`), so the T² map of a long
text never exists: the result is the same either way (tests/test_pooled.py proves it).

A figure of a long text (`reports.heatmaps.token_heatmap`) is drawn from `block_means` instead: tiles of
a fixed `block × block` units (so every drawn cell covers the same span and its label is unit `i·block`)
whose mean leaves out the cells a causal model cannot see, so that a tile on the diagonal shows what
its queries attend to, not a mean diluted by the mask.
Nothing here touches a model.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from headscope.probe.blocks import Block

__all__ = ["PooledMap", "TopKeys", "Pooler", "pool", "top_keys", "tile_index", "block_means"]


def tile_index(n: int, tiles: int) -> torch.Tensor:
    """The tile of each of `n` positions when cut into `min(tiles, n)` near-equal tiles.

    >>> tile_index(5, 2).tolist(), tile_index(3, 8).tolist()
    ([0, 0, 1, 1, 1], [0, 1, 2])
    """
    if isinstance(tiles, bool) or not isinstance(tiles, int) or tiles < 1:
        raise ValueError(f"tiles must be a positive whole number, got {tiles!r}")
    m = min(tiles, n)
    # t is in tile i when i·n // m <= t < (i + 1)·n // m, that is i = ((t + 1)·m - 1) // n
    return ((torch.arange(n) + 1) * m - 1) // max(n, 1)


@dataclass(frozen=True, eq=False)
class PooledMap:
    """A `[query, key]` map pooled into tiles: `max[i, j]` and `mean[i, j]` of the cells of tile (i, j).

    `query_edges[i]` .. `query_edges[i + 1] - 1` are the query positions of tile row i (keys alike).
    """

    max: torch.Tensor  # (tiles_q, tiles_k)
    mean: torch.Tensor  # (tiles_q, tiles_k)
    query_edges: tuple[int, ...]
    key_edges: tuple[int, ...]

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.max.shape)

    def to_frame(self) -> pd.DataFrame:
        """One row per tile: its query and key ranges (stop exclusive), max and mean."""
        qe, ke = self.query_edges, self.key_edges
        rows = [{"tile_query": i, "tile_key": j, "query_start": qe[i], "query_stop": qe[i + 1],
                 "key_start": ke[j], "key_stop": ke[j + 1], "max": float(self.max[i, j]),
                 "mean": float(self.mean[i, j])}
                for i in range(self.shape[0]) for j in range(self.shape[1])]
        return pd.DataFrame(rows)

    def to_dict(self, decimals: int | None = None) -> dict:
        """JSON-ready: edges and the two grids as nested lists (rounded to `decimals` when given)."""
        def grid(t: torch.Tensor) -> list:
            return (t if decimals is None else t.mul(10**decimals).round().div(10**decimals)).tolist()

        return {"query_edges": list(self.query_edges), "key_edges": list(self.key_edges),
                "max": grid(self.max), "mean": grid(self.mean)}


@dataclass(frozen=True, eq=False)
class TopKeys:
    """Per query row `query_start + r`: its `k` largest keys (`keys[r]`, positions) and their `weights[r]`."""

    query_start: int
    keys: torch.Tensor  # (R, k) long
    weights: torch.Tensor  # (R, k)

    def to_dict(self) -> dict:
        return {"query_start": self.query_start, "keys": self.keys.tolist(), "weights": self.weights.tolist()}

    def to_frame(self) -> pd.DataFrame:
        R, k = self.keys.shape
        return pd.DataFrame({"query": [self.query_start + r for r in range(R) for _ in range(k)],
                             "rank": [j for _ in range(R) for j in range(k)],
                             "key": self.keys.flatten().tolist(), "weight": self.weights.flatten().tolist()})


def top_keys(rows: torch.Tensor, k: int, *, query_start: int = 0) -> TopKeys:
    """The `k` largest keys of each row of `rows` (R, K), largest first (among equal weights, any one)."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be a positive whole number, got {k!r}")
    rows = rows.detach().float().cpu()
    top = rows.topk(min(k, rows.shape[-1]), dim=-1)  # O(K) per row: a full sort of 4,000-key rows is 30x slower
    return TopKeys(query_start, top.indices, top.values)


class Pooler:
    """Folds row blocks of one head (`consume(block)` for recompute `Block`s, `add(start, rows)` for
    plain `[R, K]` rows) into its `PooledMap`; every query row must come once."""

    def __init__(self, *, n_queries: int, n_keys: int, tiles: int, layer: int | None = None,
                 head: int | None = None) -> None:
        self.layer, self.head = layer, head
        self._qi, self._ki = tile_index(n_queries, tiles), tile_index(n_keys, tiles)
        tq, tk = int(self._qi[-1]) + 1 if n_queries else 0, int(self._ki[-1]) + 1 if n_keys else 0
        self._max = torch.zeros(tq, tk)
        self._sum = torch.zeros(tq, tk, dtype=torch.float64)  # sums of up to T²/tiles² cells: float64
        self._seen = torch.zeros(n_queries, dtype=torch.bool)

    def consume(self, block: Block) -> None:
        if self.layer is not None and block.layer != self.layer:
            return
        if self.head is not None:
            if self.head not in block.heads:
                return
            self.add(block.query_start, block.probs[block.heads.index(self.head)])

    def add(self, query_start: int, rows: torch.Tensor) -> None:
        rows = rows.detach().float().cpu()  # (R, K)
        R, K = rows.shape
        if K != len(self._ki):
            raise ValueError(f"rows have {K} keys, the map {len(self._ki)}")
        tk = self._max.shape[1]
        ki = self._ki.expand(R, K)
        # keys first: (R, K) -> (R, tk), then rows into their tiles
        kmax = rows.new_zeros(R, tk).scatter_reduce_(1, ki, rows, "amax", include_self=False)
        ksum = torch.zeros(R, tk, dtype=torch.float64).scatter_add_(1, ki, rows.double())
        qi = self._qi[query_start : query_start + R]
        self._max.scatter_reduce_(0, qi[:, None].expand(R, tk), kmax, "amax")  # weights ≥ 0: the zero start is no larger
        self._sum.index_add_(0, qi, ksum)
        self._seen[query_start : query_start + R] = True

    def result(self) -> PooledMap:
        missing = (~self._seen).nonzero().flatten().tolist()
        if missing:
            raise ValueError(f"no rows were given for queries {missing[:5]}{' …' if len(missing) > 5 else ''}")
        q_count = torch.bincount(self._qi, minlength=self._max.shape[0]).double()
        k_count = torch.bincount(self._ki, minlength=self._max.shape[1]).double()
        mean = (self._sum / (q_count[:, None] * k_count[None, :])).float()
        return PooledMap(self._max.clone(), mean, _edges(self._qi), _edges(self._ki))


def _edges(index: torch.Tensor) -> tuple[int, ...]:
    counts = torch.bincount(index).tolist() if len(index) else []
    edges = [0]
    for c in counts:
        edges.append(edges[-1] + c)
    return tuple(edges)


def pool(weights: torch.Tensor, tiles: int) -> PooledMap:
    """A whole `[query, key]` map pooled into at most `tiles × tiles` tiles (max and mean per tile).

    >>> p = pool(torch.eye(4), 2)
    >>> p.max.tolist(), p.mean.tolist()
    ([[1.0, 0.0], [0.0, 1.0]], [[0.5, 0.0], [0.0, 0.5]])
    """
    if weights.dim() != 2:
        raise ValueError(f"pool takes one head's [query, key] map, got shape {tuple(weights.shape)}")
    p = Pooler(n_queries=weights.shape[0], n_keys=weights.shape[1], tiles=tiles)
    p.add(0, weights)
    return p.result()


def block_means(weights: np.ndarray, block: int) -> np.ndarray:
    """Mean over `block` × `block` tiles of a `[query, key]` map (NaN, the cells a causal model cannot see,
    left out; a tile of only NaN stays NaN); the last tiles may be smaller.

    >>> block_means(np.arange(16.0).reshape(4, 4), 2).tolist()
    [[2.5, 4.5], [10.5, 12.5]]
    """
    if block == 1:
        return weights
    n_q, n = weights.shape
    m_q, m = -(-n_q // block), -(-n // block)
    padded = np.full((m_q * block, m * block), np.nan)
    padded[:n_q, :n] = weights
    tiles = padded.reshape(m_q, block, m, block)
    counts = np.isfinite(tiles).sum(axis=(1, 3))
    sums = np.nansum(tiles, axis=(1, 3))
    return np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)
