"""The one progress bar: tqdm's plain text form on stderr, for every room (`progress(...)`).

tqdm's plain form (`tqdm.std`), never `tqdm.auto`: in a notebook `tqdm.auto` wants ipywidgets and, without
it, opens the first cell with "IProgress not found"; the plain bar prints the same line there as in a
terminal. Off (`enabled=False`) it is the iterable itself, with `update` and `close` that do nothing, so a
caller writes the same code either way. A command's `--quiet` turns it off (`common.options.quiet`).
"""

from __future__ import annotations

import sys
from typing import Any, Iterable

__all__ = ["progress", "extend"]


def progress(iterable: Iterable | None = None, *, enabled: bool | None = True, total: int | None = None,
             desc: str | None = None, unit: str = "it", leave: bool = True, **options: Any):
    """`iterable` under a progress bar on stderr (`tqdm.std.tqdm`), or a bar to `update` by hand when it is
    None; `enabled=False` gives no bar at all, `None` a bar only where stderr is a terminal.

    >>> list(progress(range(3), enabled=False))
    [0, 1, 2]
    """
    from tqdm.std import tqdm

    return tqdm(iterable, total=total, desc=desc, unit=unit, leave=leave, file=sys.stderr,
                disable=None if enabled is None else not enabled,
                dynamic_ncols=True, **options)


def extend(bar, steps: int) -> None:
    """Add `steps` to the total of `bar` (a `progress(...)` bar, or None: nothing), for work that learns its size
    stage by stage (patching: each stage adds its forward passes as it starts).

    >>> bar = progress(total=None, enabled=False)
    >>> extend(bar, 3); extend(bar, 2); bar.total
    5
    """
    if bar is None:
        return
    bar.total = (bar.total or 0) + steps
    bar.refresh()
