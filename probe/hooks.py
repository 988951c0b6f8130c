"""One way to reach a module of a model and catch, watch or replace what goes into it or comes out of it.

Every probe that looks inside a forward pass needs the same three steps: find the modules (by dotted path, or
through a family's declared names: `LayerModules(family, base, config, layers, where="attention")`), hook each
one, and remove every hook however the block ends. `catch`, `watch` and `replace` are those steps, once, as
context managers (in the spirit of nnsight's Envoy, kept to the things the probes do):

    with catch({i: family.out_proj(base, i) for i in layers}) as outs:
        model(**batch)
    outs[3]  # layer 3's attention output after W_O, detached

A module's *input* is its first positional argument, or its `hidden_states` keyword where a model passes that
by name; its *arguments* are the call's `(args, kwargs)`; its *output* is what its forward returns. `catch` keeps
`take(value)` (default: the value, detached where it is a tensor); `watch` calls `see(key, value)` on every call;
`replace` hands on `change(key, value)` instead of the value. Hooks are removed on every exit, an exception inside
the block included.

The callbacks run inside the forward pass, so they may also stop it (raise an exception of the caller's own and
catch it around the forward call: the layers after it never run) or wait there (hand the value to another thread
and block until it is taken). `thread=` limits the hooks to one thread's calls: another thread's pass through the
same model (a server's) goes through untouched.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any, Literal

import torch

What = Literal["input", "output", "arguments"]
Modules = Mapping[Hashable, torch.nn.Module]


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


@dataclass(frozen=True)
class LayerModules:
    """The attention module (`where="attention"`) or out-projection ("out_proj") of each of `layers`, found
    through the family's declared names and keyed by layer: what `catch`, `watch` and `replace` take in place
    of a dict of modules.

    Where several layers run one module object (ALBERT shares one layer across all of them), one hook on it
    dispatches by call order: in a forward pass a thread's k-th call of the module is the k-th of the layers
    that use it, so every layer is caught apart, never the last repeat for all of them."""

    family: Any
    base: torch.nn.Module
    config: Any
    layers: tuple[int, ...]
    where: Literal["attention", "out_proj"]

    def __post_init__(self) -> None:
        object.__setattr__(self, "layers", tuple(int(layer) for layer in self.layers))  # any sequence, kept as a tuple

    def users(self) -> list[tuple[torch.nn.Module, list[int]]]:
        """Each module once, with every layer that runs it, in forward order."""
        get = self.family.attention if self.where == "attention" else self.family.out_proj
        users: dict[int, tuple[torch.nn.Module, list[int]]] = {}
        for layer in self.family.attention_layers(self.config):
            module = get(self.base, layer)
            users.setdefault(id(module), (module, []))[1].append(layer)
        return list(users.values())


@contextmanager
def catch(modules: Modules | LayerModules, *, what: What = "output", take: Callable[[Any], Any] = _detached,
          thread: threading.Thread | None = None) -> Iterator[dict]:
    """Within the block, `take(value)` of each module's input, arguments or output is kept under its key in the yielded
    dict (the last call's, where a module runs more than once). `thread`: only that thread's calls."""
    caught: dict = {}
    with watch(modules, lambda key, value: caught.__setitem__(key, take(value)), what=what, thread=thread):
        yield caught


def catch_layers(family, base: torch.nn.Module, config, layers: Sequence[int], *,
                 where: Literal["attention", "out_proj"], what: What = "output",
                 take: Callable[[Any], Any] = _detached):
    """`catch` on the family's attention module (or out-projection) of each of `layers`, keyed by layer
    (`LayerModules`: layers that share one module, ALBERT's, told apart by call order)."""
    return catch(LayerModules(family, base, config, tuple(layers), where), what=what, take=take)


@contextmanager
def watch(modules: Modules | LayerModules, see: Callable[[Hashable, Any], Any], *, what: What = "output",
          thread: threading.Thread | None = None) -> Iterator[None]:
    """Within the block, `see(key, value)` runs on every call of each module with its input, arguments or
    output; what it returns is ignored (it may raise to stop the pass, or wait). `thread`: only that thread's calls."""
    with _hooked(modules, lambda key: _hook(key, see, what, swap=False), what=what, thread=thread):
        yield


@contextmanager
def replace(modules: Modules | LayerModules, change: Callable[[Hashable, Any], Any], *, what: What = "output",
            thread: threading.Thread | None = None) -> Iterator[None]:
    """Within the block, each module's input, arguments or output is replaced by `change(key, value)`; a `change`
    that returns None leaves the value as it was. For `what="arguments"` the value and its replacement are an
    `(args, kwargs)` pair (the way to change a keyword argument, an attention mask say). `thread`: only that thread's calls."""
    with _hooked(modules, lambda key: _hook(key, change, what, swap=True), what=what, thread=thread):
        yield


def _hook(key, fn: Callable[[Hashable, Any], Any], what: What, *, swap: bool) -> Callable:
    """The torch hook that calls `fn(key, value)` on one module's input, arguments or output, and where `swap`,
    hands on what it returns (None: the value as it was)."""
    if what == "output":
        def post(module, args, out):
            new = fn(key, out)
            return new if swap else None
        return post

    def pre(module, args, kwargs):
        new = fn(key, (args, kwargs) if what == "arguments" else first_input(args, kwargs))
        if not swap or new is None or what == "arguments":
            return new if swap else None
        return ((new, *args[1:]), kwargs) if args else (args, {**kwargs, "hidden_states": new})
    return pre


@contextmanager
def _hooked(modules: Modules | LayerModules, make: Callable[[Hashable], Callable], *, what: What,
            thread: threading.Thread | None) -> Iterator[None]:
    """`make(key)` registered on each module (a forward hook for `what="output"`, else a forward pre-hook with
    the call's keyword arguments), all removed on every exit."""
    with ExitStack() as stack:
        for module, fn in _targets(modules, make):
            if thread is not None:
                fn = _only_on(thread, fn)
            if what == "output":
                handle = module.register_forward_hook(fn)
            else:
                handle = module.register_forward_pre_hook(fn, with_kwargs=True)
            stack.callback(handle.remove)
        yield


def _targets(modules: Modules | LayerModules, make: Callable[[Hashable], Callable]) -> list[tuple[torch.nn.Module, Callable]]:
    if not isinstance(modules, LayerModules):
        return [(module, make(key)) for key, module in modules.items()]
    wanted, targets = set(modules.layers), []
    for module, order in modules.users():
        hooks = {layer: make(layer) for layer in order if layer in wanted}
        if hooks:
            targets.append((module, hooks[order[0]] if len(order) == 1 else _by_call_order(order, hooks)))
    return targets


def _by_call_order(order: list[int], hooks: dict) -> Callable:
    """One hook for a module that layers `order` share: a thread's call k runs the hook of layer
    order[k mod len(order)]. Calls are counted per thread: another thread's pass through the same model (a
    server's, perhaps stopped after its first layer) must not shift this one's count."""
    calls: dict[int, int] = {}

    def dispatch(*args):
        me = threading.get_ident()
        k = calls[me] = calls.get(me, -1) + 1
        hook = hooks.get(order[k % len(order)])
        return None if hook is None else hook(*args)

    return dispatch


def _only_on(thread: threading.Thread, fn: Callable) -> Callable:
    """`fn`, run for calls made on `thread` only (others pass through unchanged)."""
    return lambda *args: fn(*args) if threading.current_thread() is thread else None
