"""Blocks of query rows: the unit recomputed attention comes in, and the buffers they are written into.

`probe.recompute` makes them (`layer_blocks`, `iter_blocks`) and `analyses.blocks` / `analyses.heads`
fold them; both import them from here, a module that runs no model (torch only), so the analyses
never load the engine that recomputes attention.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:  # annotations only: torch is imported by the functions that compute with it
    import torch

__all__ = ["Block", "Buffers"]


class Block:
    """Attention probabilities of some query rows of one layer: `probs[head, query, key]`.

    Rows are queries `query_start .. query_start + R - 1` of the text, keys are all T positions;
    `heads` are the model's head indices of the first axis. Keys outside `key_start .. key_stop - 1`
    are exact zeros in every row (masked: a causal block's rows stop at their diagonal), so a
    reduction may read `band` (those keys only, (H, R, K)) instead of `probs`. A block made by
    `Block.banded` holds only its band: `probs` (H, R, T) is assembled the first time it is read.
    Read-only, compared by identity.

    >>> import torch
    >>> b = Block.banded(0, (0,), 1, torch.tensor([[[0.5, 0.5]]]), key_start=0, n_keys=3)
    >>> b.band, b.key_stop, b.query_stop
    (tensor([[[0.5000, 0.5000]]]), 2, 2)
    >>> b.probs
    tensor([[[0.5000, 0.5000, 0.0000]]])
    """

    __slots__ = ("layer", "heads", "query_start", "key_start", "key_stop", "_probs", "_band", "_n_keys")

    def __init__(self, layer: int, heads: tuple[int, ...], query_start: int, probs: torch.Tensor,
                 key_start: int = 0, key_stop: int | None = None) -> None:
        for name, value in (("layer", layer), ("heads", heads), ("query_start", query_start), ("key_start", key_start),
                            ("key_stop", key_stop), ("_probs", probs), ("_band", None), ("_n_keys", probs.shape[-1])):
            object.__setattr__(self, name, value)

    @classmethod
    def banded(cls, layer: int, heads: tuple[int, ...], query_start: int, band: torch.Tensor, *, key_start: int,
               n_keys: int) -> "Block":
        """A block given by its band, the keys `key_start .. key_start + K - 1` of `n_keys`: (H, R, K)."""
        block = cls(layer, heads, query_start, band, key_start, key_start + band.shape[-1])
        object.__setattr__(block, "_probs", None)
        object.__setattr__(block, "_band", band)
        object.__setattr__(block, "_n_keys", n_keys)
        return block

    @property
    def probs(self) -> torch.Tensor:
        """(H, R, T): every key, exact zeros outside the band."""
        if self._probs is None:  # assembled once, then the band is a view of it
            object.__setattr__(self, "_probs", _all_keys(self._band, self.key_start, self._n_keys))
            object.__setattr__(self, "_band", None)
        return self._probs

    @property
    def band(self) -> torch.Tensor:
        """The probabilities of the keys `key_start .. key_stop - 1` only: (H, R, K)."""
        if self._band is not None:
            return self._band
        return self._probs[..., self.key_start : self.key_stop]

    @property
    def query_stop(self) -> int:
        return self.query_start + (self._band if self._band is not None else self._probs).shape[-2]

    @property
    def n_keys(self) -> int:
        """T, the keys of the text (the last axis of `probs`)."""
        return self._n_keys

    def __setattr__(self, name, value):
        raise AttributeError(f"a Block is read-only; cannot set {name!r}")

    def __delattr__(self, name):
        raise AttributeError(f"a Block is read-only; cannot delete {name!r}")

    def __repr__(self) -> str:
        shape = (*self.band.shape[:-1], self._n_keys)
        return (f"Block(layer={self.layer}, heads={self.heads}, query_start={self.query_start}, "
                f"probs=<{tuple(shape)}>, key_start={self.key_start}, key_stop={self.key_stop})")


def _all_keys(band: torch.Tensor, lo: int, n_keys: int) -> torch.Tensor:
    """(H, R, n_keys) with the band's keys lo .. lo + K - 1 in place and exact zeros elsewhere."""
    hi = lo + band.shape[-1]
    if lo == 0 and hi == n_keys:
        return band
    probs = band.new_empty(*band.shape[:-1], n_keys)  # only the keys outside the band are zeroed
    probs[..., :lo] = 0
    probs[..., hi:] = 0
    probs[..., lo:hi] = band
    return probs


class Buffers:
    """Two flat buffers handed out in turn, for blocks that a consumer reads and drops one at a time.

    A fresh large tensor costs the kernel's zeroing of its pages, about as much as one pass over it; a
    buffer written over costs nothing. `take` reuses the buffer handed out two calls ago only when
    nothing holds its storage any more (a `for` loop still holds the block before, hence two); a
    consumer that keeps its blocks gets fresh tensors, as without buffers.

    >>> import torch
    >>> buffers = Buffers()
    >>> a, b = buffers.take((2, 3), torch.zeros(1)), buffers.take((2, 3), torch.zeros(1))
    >>> c = buffers.take((2, 3), torch.zeros(1))
    >>> c.data_ptr() == a.data_ptr()  # `a` is still held here: not reused
    False
    """

    def __init__(self) -> None:
        self._flat: list[torch.Tensor | None] = [None, None]
        self._turn = 0

    def take(self, shape: Sequence[int], like: torch.Tensor, *, at_least: int = 0) -> torch.Tensor:
        """An uninitialised tensor of `shape`, `like`'s dtype and device (room for `at_least` elements)."""
        n = 1
        for size in shape:
            n *= int(size)
        self._turn ^= 1
        flat = self._flat[self._turn]
        if (flat is None or flat.numel() < n or flat.dtype != like.dtype or flat.device != like.device
                or not _unshared(flat)):
            flat = self._flat[self._turn] = like.new_empty(max(n, at_least))
        return flat[:n].view(*shape)


def _unshared(flat: torch.Tensor) -> bool:
    """Whether `flat`'s storage is held by `flat` alone (no view of it is alive anywhere)."""
    import torch
    try:  # the storage's reference count: `flat` and the handle asked for here
        return torch._C._storage_Use_Count(flat.untyped_storage()._cdata) <= 2
    except (AttributeError, RuntimeError):  # no way to tell: never reuse
        return False
