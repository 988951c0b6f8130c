"""Sizes in bytes, as people write them: the one reader of every size and memory budget, the API's and the CLI's.

    parse_size          8GB, 512MiB, 1.5 GB, 1000000, or an int of bytes
    parse_max_memory    accelerate's max_memory from cpu=300MB or 0=20GiB,1=20GiB,cpu=60GiB, or a dict
                        {device: size} whose sizes are ints or such strings ({"cpu": "300MB"})

`hs.load(max_memory=...)`, `memory_budget=...` and the flags `--max-memory`, `--memory-budget` all go
through these, so a value one takes the others take. A bad value is a ValueError whose line names the value
and what to give, never a flag or an argument: each caller says which one it read. Imports nothing heavy.
"""

from __future__ import annotations

import re
from typing import Mapping

__all__ = ["parse_size", "parse_max_memory", "SIZE_UNITS"]

SIZE_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
              "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_DEVICES = ("cpu", "mps", "disk")


def parse_size(value: int | str) -> int:
    """Bytes from `8GB`, `512MiB`, `1.5 GB`, a plain number of bytes, or an int (at least 1 byte).

    >>> parse_size("8GB"), parse_size("512MiB"), parse_size("1000"), parse_size(300_000_000)
    (8000000000, 536870912, 1000, 300000000)
    """
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 1:
            raise ValueError(f"{value!r} is not a size; give at least 1 byte, such as 8GB, 512MiB or 1000000")
        return value
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]*)?)\s*([a-zA-Z]*)\s*", value) if isinstance(value, str) else None
    unit = m and m.group(2).lower()
    if not m or unit not in SIZE_UNITS or int(float(m.group(1)) * SIZE_UNITS[unit]) < 1:
        raise ValueError(f"{value!r} is not a size; give bytes such as 8GB, 512MiB or 1000000")
    return int(float(m.group(1)) * SIZE_UNITS[unit])


def _device(where: object) -> int | str:
    """A budget's device: a GPU's number (an int, `1`, `cuda:1`), or cpu, mps, disk."""
    if isinstance(where, int) and not isinstance(where, bool) and where >= 0:
        return where
    if isinstance(where, str):
        name = where.strip().lower().removeprefix("cuda:")
        if name in _DEVICES:
            return name
        if name.isascii() and name.isdigit():
            return int(name)
    raise ValueError(f"{where!r} is not a device; name a GPU by its number (0, 1, ...), or cpu, mps, disk")


def parse_max_memory(value: str | Mapping) -> dict[int | str, int]:
    """accelerate's `max_memory`, bytes per GPU number, `cpu`, `mps` or `disk` (`cuda:N` is GPU N), from
    `cpu=300MB` / `0=20GiB,1=20GiB,cpu=60GiB`, or from a dict whose sizes are ints or size strings.

    >>> parse_max_memory("0=1GB, cpu=300MB"), parse_max_memory({"cpu": "300MB", "cuda:1": 1000})
    ({0: 1000000000, 'cpu': 300000000}, {'cpu': 300000000, 1: 1000})
    """
    if isinstance(value, str):
        pairs = []
        for part in value.split(","):
            where, eq, size = part.partition("=")
            try:
                _device(where)
            except ValueError:
                eq = ""
            if not eq:
                raise ValueError(f"{part.strip()!r} is not DEVICE=SIZE; give e.g. cpu=300MB or "
                                 "0=20GiB,1=20GiB,cpu=60GiB (a GPU by its number, or cpu, mps, disk)")
            pairs.append((where, size))
    elif isinstance(value, Mapping) and value:
        pairs = list(value.items())
    else:
        raise ValueError(f"{value!r} is not a memory budget; give sizes per device, such as {{'cpu': '300MB'}} or "
                         "'0=20GiB,cpu=60GiB'")
    budget: dict[int | str, int] = {}
    for where, size in pairs:
        key = _device(where)
        if key in budget:
            raise ValueError(f"{where!r} names {key} twice; give each device once")
        try:
            budget[key] = parse_size(size)
        except ValueError as exc:
            raise ValueError(f"{key}: {exc}") from None
    return budget
