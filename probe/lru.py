"""The few most recently used values, by key: what the live explorer keeps of its texts, generations and layer inputs.

`functools.lru_cache` caches a function's calls for the life of the process; these caches belong to one
object (a served model, a live text), hold values too large to keep many of, and a holder may widen one
(`size`) once it knows what fits.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Callable, Generic, Hashable, TypeVar

__all__ = ["LRU"]

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class LRU(Generic[K, V]):
    """At most `size` values; reading or storing one makes it the newest, storing past `size` drops the oldest.

    >>> cache = LRU(2)
    >>> cache["a"], cache["b"] = 1, 2
    >>> cache["a"]  # now the newest
    1
    >>> cache["c"] = 3  # drops "b", the oldest
    >>> list(cache), cache.get("b", lambda: 20), list(cache)
    (['a', 'c'], 20, ['c', 'b'])
    """

    def __init__(self, size: int) -> None:
        self._items: OrderedDict[K, V] = OrderedDict()
        self.size = size

    @property
    def size(self) -> int:
        return self._size

    @size.setter
    def size(self, value: int) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"an LRU cache holds at least 1 value; size must be a whole number >= 1, got {value!r}")
        self._size = value
        self._trim()

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self):
        """The keys, oldest first."""
        return iter(list(self._items))

    def __getitem__(self, key: K) -> V:
        self._items.move_to_end(key)
        return self._items[key]

    def __setitem__(self, key: K, value: V) -> None:
        self._items[key] = value
        self._items.move_to_end(key)
        self._trim()

    def get(self, key: K, make: Callable[[], V]) -> V:
        """The value of `key`, made by `make()` and stored when it is not held (nothing is stored if `make` raises)."""
        if key in self._items:
            return self[key]
        value = make()
        self[key] = value
        return value

    def _trim(self) -> None:
        while len(self._items) > self._size:
            self._items.popitem(last=False)
