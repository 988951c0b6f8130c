"""Weights that accelerate offloaded (to disk, or to the cpu beside a GPU), brought in for the code that reads
them outside a forward pass.

A model placed with `max_memory` / `offload_folder` (`probe.loading.load_model`) keeps an offloaded block's
parameters on the `meta` device; accelerate's hook on the block loads them onto its execution device for
that block's forward and drops them after. Code that reads weights directly — a layer's `LayerSpec` for the
from-scratch attention, a norm's scale, the unembedding — asks for them with `onloaded`: inside, the blocks
holding those modules are in memory (one layer's weights, not the model), and tensors taken from them stay
valid after, for as long as they are referenced.

    with onloaded(base.layers[1].self_attn, base.layers[1].self_attn.o_proj):
        spec = llama_spec(base, 1, config)          # real tensors, not meta
"""

from __future__ import annotations

import functools
from contextlib import ExitStack, contextmanager
from typing import Callable, Iterator

import torch

from .heap import cpu_churning, malloc_trim, offloading_hook

__all__ = ["onloaded", "onloading"]


def _meta(module: torch.nn.Module) -> bool:
    return any(p.device.type == "meta" for p in module.parameters())


@contextmanager
def onloaded(*modules: torch.nn.Module | None) -> Iterator[None]:
    """Inside: the parameters of `modules` in memory on their execution device; put back on leaving.

    accelerate hooks each offloaded module that holds parameters itself (a Linear, a norm); those in
    `modules` are loaded, and a module already in memory (its forward is running) is left as it is.
    Nothing happens for a model that is not offloaded. Weights brought into cpu memory leave the allocator's
    heap with them (`probe.heap`).
    """
    wanted = [m for m in modules if m is not None and _meta(m)]
    if not wanted:
        yield
        return
    with ExitStack() as stack:
        trim = malloc_trim()
        for leaf in {id(sub): sub for m in wanted for sub in m.modules()}.values():
            hook = offloading_hook(leaf)
            if hook is not None and any(p.device.type == "meta" for p in leaf.parameters(recurse=False)):
                if trim is not None and cpu_churning(leaf):  # runs last, once every weight is put back
                    stack.callback(trim)
                    trim = None
                hook.pre_forward(leaf)
                stack.callback(hook.post_forward, leaf, None)
        if any(_meta(m) for m in wanted):
            raise RuntimeError("some weights of this model are offloaded where headscope cannot bring them in; "
                               "load it without max_memory / offload_folder")
        yield


def onloading(read: Callable, *modules_of: Callable) -> Callable:
    """`read(base, i, *rest)` (a family's `layer_spec`) run with the weights of each `module_of(base, i)` (its
    attention module and output projection) `onloaded`."""
    @functools.wraps(read)
    def wrapper(base, i, *rest):
        with onloaded(*(module_of(base, i) for module_of in modules_of)):
            return read(base, i, *rest)

    return wrapper
