"""One way to reach a module of a model and catch or replace what goes into it or comes out of it.

Every probe that looks inside a forward pass needs the same three steps: find the modules (by dotted path, or
through a family's declared names: `family.attention(base, i)`, `family.out_proj(base, i)`), hook each one, and
remove every hook however the block ends. `catch` and `replace` are those steps, once, as context managers
(in the spirit of nnsight's Envoy, kept to the two things the probes do):

    with catch({i: family.out_proj(base, i) for i in layers}) as outs:
        model(**batch)
    outs[3]  # layer 3's attention output after W_O, detached

A module's *input* is its first positional argument, or its `hidden_states` keyword where a model passes that
by name; its *arguments* are the call's `(args, kwargs)`; its *output* is what its forward returns. `take` picks the part to keep (default: the value,
detached where it is a tensor). Hooks are removed on every exit, an exception inside the block included.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from typing import Any, Literal

import torch

What = Literal["input", "output", "arguments"]


def module_at(model: torch.nn.Module, path: str) -> torch.nn.Module:
    """The submodule at dotted `path` ("model.layers.3.self_attn"); one line naming the path when there is none."""
    try:
        return model.get_submodule(path) if path else model
    except AttributeError:
        raise LookupError(f"{type(model).__name__} has no module at {path!r}") from None


def modules_at(model: torch.nn.Module, where: Mapping[Hashable, str | torch.nn.Module]) -> dict:
    """`where` with each dotted path resolved to its module (modules pass through)."""
    return {key: module_at(model, m) if isinstance(m, str) else m for key, m in where.items()}


def first_input(args: tuple, kwargs: dict):
    """A module call's main input: its first positional argument, else its `hidden_states` keyword."""
    return args[0] if args else kwargs["hidden_states"]


def first_output(out):
    """A module's main output: the first element where it returns a tuple (a block's hidden states)."""
    return out[0] if isinstance(out, tuple) else out


def _detached(value):
    return value.detach() if isinstance(value, torch.Tensor) else value


@contextmanager
def catch(modules: Mapping[Hashable, torch.nn.Module], *, what: What = "output",
          take: Callable[[Any], Any] = _detached) -> Iterator[dict]:
    """Within the block, `take(value)` of each module's input, arguments or output is kept under its key in the yielded
    dict (the last call's, where a module runs more than once)."""
    caught: dict = {}
    with hooked({key: (module, _keeper(caught, key, what, take)) for key, module in modules.items()}, what=what):
        yield caught


@contextmanager
def catch_layers(family, base: torch.nn.Module, config, layers: Sequence[int], *,
                 where: Literal["attention", "out_proj"], what: What = "output",
                 take: Callable[[Any], Any] = _detached) -> Iterator[dict]:
    """`catch` on the family's attention module (or out-projection) of each of `layers`, keyed by layer. Where
    several layers run one module object (ALBERT), each call is told apart by its order (`Family.hook_layers`)."""
    caught: dict = {}
    handles = family.hook_layers(base, config, list(layers), lambda layer: _keeper(caught, layer, what, take),
                                 where=where, pre=what != "output", with_kwargs=what != "output")
    try:
        yield caught
    finally:
        for handle in handles:
            handle.remove()


def _keeper(caught: dict, key, what: What, take: Callable):
    """The hook that keeps `take(...)` of one module's input, arguments or output in `caught[key]`."""
    if what == "input":
        return lambda module, args, kwargs: caught.__setitem__(key, take(first_input(args, kwargs)))
    if what == "arguments":
        return lambda module, args, kwargs: caught.__setitem__(key, take((args, kwargs)))
    return lambda module, args, out: caught.__setitem__(key, take(out))


@contextmanager
def replace(modules: Mapping[Hashable, torch.nn.Module], change: Callable[[Hashable, Any], Any], *,
            what: What = "output") -> Iterator[None]:
    """Within the block, each module's input (its first positional argument) or output is replaced by
    `change(key, value)`; a `change` that returns None leaves the value as it was."""

    if what == "arguments":
        raise ValueError("replace() swaps a module's input or output; to change other arguments use hooked()")

    def swap(key):
        if what == "input":
            def pre(module, args):
                new = change(key, args[0])
                return None if new is None else (new, *args[1:])
            return pre
        return lambda module, args, out: change(key, out)

    with hooked({key: (module, swap(key)) for key, module in modules.items()}, what=what, kwargs=False):
        yield


@contextmanager
def hooked(hooks: Mapping[Hashable, tuple[torch.nn.Module, Callable]], *, what: What,
           kwargs: bool = True) -> Iterator[None]:
    """The raw form: each `(module, fn)` registered as a forward pre-hook (`what="input"` or "arguments"; with
    its keyword arguments where `kwargs`) or forward hook (`what="output"`), all removed on every exit."""
    with ExitStack() as stack:
        for module, fn in hooks.values():
            if what != "output":
                handle = module.register_forward_pre_hook(fn, with_kwargs=kwargs)
            else:
                handle = module.register_forward_hook(fn)
            stack.callback(handle.remove)
        yield
