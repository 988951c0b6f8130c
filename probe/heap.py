"""Memory freed by an offloaded layer handed back to the system as soon as the layer has run.

accelerate brings a disk-offloaded layer's weights into memory just before the layer runs and drops
them right after: a few megabytes allocated and freed per layer per batch, in between activations
that stay alive. glibc's allocator keeps such freed chunks inside its heap (its threshold for giving a
large block a mapping of its own rises each time one is freed), so an offloaded run's resident memory
grows with that churn, not with what is alive (docs/performance.md, row P2). `malloc_trim(0)` after each offloaded layer gives the free pages back,
whatever the allocator's settings; the cost is one walk of the allocator's free lists per layer call,
small beside reading the layer from disk.

Only glibc has `malloc_trim`; elsewhere (macOS, musl, Windows) nothing is hooked. A model held wholly
in memory is left alone: it churns no weights.
"""

from __future__ import annotations

import ctypes
from typing import Callable

__all__ = ["malloc_trim", "trim_after_offloaded"]


def malloc_trim() -> Callable[[], int] | None:
    """glibc's `malloc_trim(0)` as a call, or None where the C library has none."""
    try:
        fn = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError, TypeError):
        return None
    fn.argtypes, fn.restype = [ctypes.c_size_t], ctypes.c_int
    return lambda: fn(0)


def trim_after_offloaded(model, *, trim: Callable[[], int] | None = None) -> list[str]:
    """Hook each module that `model.hf_device_map` places on "disk" so that `trim` runs after its forward
    (accelerate's own hook has dropped its weights by then). The names of the hooked modules, in order;
    none where nothing is on disk or the C library cannot trim. Meant for a model headscope loads, once."""
    trim = malloc_trim() if trim is None else trim
    placed = getattr(model, "hf_device_map", None) or {}
    on_disk = [name for name, where in placed.items() if where == "disk"]
    if trim is None or not on_disk:
        return []
    def after(module, args, output) -> None:  # returns None: the module's output stays its own
        trim()

    modules = dict(model.named_modules())
    hooked = []
    for name in on_disk:
        module = modules.get(name)
        if module is None:  # accelerate names a parameter, not a module: its owner runs it
            continue
        module.register_forward_hook(after, always_call=True)
        hooked.append(name)
    return hooked
