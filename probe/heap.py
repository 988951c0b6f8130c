"""Memory freed by an offloaded layer handed back to the system as soon as the layer has run.

accelerate brings a disk-offloaded module's weights into memory just before it runs and drops them
right after: megabytes allocated and freed per module per batch, in between activations that stay
alive. glibc's allocator keeps such freed chunks inside its heap (its threshold for giving a large
block a mapping of its own rises each time one is freed), so an offloaded run's anonymous memory grows
with that churn, not with what is alive (docs/performance.md, rows P2 and P3). `malloc_trim(0)` gives
the free pages back, whatever the allocator's settings; it runs after each block that brought weights in
(a decoder layer: the model's own unit of placement, `_no_split_modules`; a module outside any such
block, an embedding or a norm, on its own) and after `probe.placement.onloaded` puts weights back. The
cost is one walk of the allocator's free lists per block, small beside reading the block from disk.

The blocks are found by accelerate's hooks, not by the names of `hf_device_map`: a model placed wholly
on disk has one entry, `""` (the whole model), whose forward never runs when the base model is called.

Only glibc has `malloc_trim`; elsewhere (macOS, musl, Windows) nothing is hooked. A model held wholly
in memory is left alone: it churns no weights; so is a module whose weights wait in cpu memory for a GPU
(accelerate copies them to the GPU, whose memory they churn, not this heap's).
"""

from __future__ import annotations

import ctypes
from typing import Callable

import torch

__all__ = ["malloc_trim", "offloading_hook", "cpu_churning", "trim_after_offloaded"]


def malloc_trim() -> Callable[[], int] | None:
    """glibc's `malloc_trim(0)` as a call, or None where the C library has none."""
    try:
        fn = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError, TypeError):
        return None
    fn.argtypes, fn.restype = [ctypes.c_size_t], ctypes.c_int
    return lambda: fn(0)


def offloading_hook(module: torch.nn.Module):
    """The accelerate hook that brings `module`'s own weights in for its forward, or None."""
    hook = getattr(module, "_hf_hook", None)
    hooks = getattr(hook, "hooks", (hook,))  # accelerate's SequentialHook holds several
    return next((h for h in hooks if getattr(h, "offload", False)), None)


def cpu_churning(module: torch.nn.Module) -> bool:
    """Whether accelerate brings `module`'s own weights into cpu memory for each forward and drops them after:
    it runs on the cpu, or it runs elsewhere (a GPU) but its weights are read from disk through the cpu."""
    hook = offloading_hook(module)
    if hook is None:
        return False
    device = getattr(hook, "execution_device", None)
    if device is not None and torch.device(device if not isinstance(device, int) else f"cuda:{device}").type == "cpu":
        return True
    weights = getattr(hook, "weights_map", None)  # accelerate's PrefixedDataset over its OffloadedWeightsLoader
    prefix = getattr(weights, "prefix", "")
    on_disk = getattr(getattr(weights, "dataset", weights), "index", None) or {}
    return any(key.startswith(prefix) for key in on_disk)


def trim_after_offloaded(model, *, trim: Callable[[], int] | None = None) -> list[str]:
    """Hook each block of `model` that brings weights into cpu memory so that `trim` runs after its forward
    (accelerate's own hooks have dropped the weights by then): a module of one of the model's
    `_no_split_modules` classes that holds such a module, else the module itself. The names of the
    hooked blocks, in model order; none where nothing churns or the C library cannot trim. Meant for a
    model headscope loads, once."""
    trim = malloc_trim() if trim is None else trim
    if trim is None:
        return []
    blocks = set(getattr(model, "_no_split_modules", None) or [])
    modules = dict(model.named_modules())
    hooked: dict[str, torch.nn.Module] = {}
    for name, module in modules.items():
        if not cpu_churning(module):
            continue
        parts = name.split(".") if name else []
        enclosing = (".".join(parts[:i]) for i in range(1, len(parts)))
        unit = next((n for n in enclosing if type(modules.get(n)).__name__ in blocks), name)
        hooked.setdefault(unit, modules[unit])

    def after(module, args, output) -> None:  # returns None: the module's output stays its own
        trim()

    for module in hooked.values():
        module.register_forward_hook(after, always_call=True)
    return list(hooked)
