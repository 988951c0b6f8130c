"""Replay the clean layers below an intervention: what an ablation of layer L cannot change is not run again.

Ablating a head of layer L leaves layers 0 .. L-1 as they were: on the same inputs their outputs are the
clean pass's, bit for bit. `CleanPrefix(lm)` records, during one clean read (`recording()`), the output of
every layer block in every forward call of the model's base; within `from_layer(L)` a call on the same
token ids gets each block below L's recorded output (a copy) instead of running it, so an ablated read
costs the embedding and the layers from L on. `read(fn, L)` does that, and the first time it replays
anything it also runs `fn` whole and compares: a model whose layers pass something besides their output
on to later layers (which the check would show as a difference) gets whole passes from then on.

No weight, buffer or hook of the model is changed: within `from_layer` each replayed block's `forward` is
an attribute of the block instance, deleted again on exit (also after an error), as `ablate`'s hooks are
removed. Nothing is replayed for a model whose layers share modules (ALBERT), whose later layers read an
earlier layer's keys and values (shared KV, Gemma 4), whose blocks cannot be found, or whose recording
would exceed `budget` bytes; then every read runs whole, as without a `CleanPrefix`.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Callable, Iterator

import torch

from .families import family_for
from .forward import base_model
from .hooks import watch
from .model import LoadedModel

__all__ = ["CleanPrefix", "layer_blocks", "REPLAY_BUDGET"]

REPLAY_BUDGET = 1 << 30  # bytes of recorded block outputs; past it nothing is replayed


def layer_blocks(lm: LoadedModel) -> list[torch.nn.Module] | None:
    """The model's layer blocks in forward order (the `ModuleList` holding each layer's attention), or None
    where blocks cannot be replayed one by one: layers that share modules, shared keys and values, no such list."""
    family = family_for(lm.config)
    base = base_model(lm)
    config = lm.config
    if family.shares_modules(base, config):
        return None
    layers = family.attention_layers(config)
    if any(family.layer_spec(base, layer, config).kv_layer is not None for layer in layers):
        return None
    attention = {layer: family.attention(base, layer) for layer in layers}
    n = family.n_layers(config)
    for module in base.modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) == n and all(
                any(sub is attn for sub in module[layer].modules()) for layer, attn in attention.items()):
            return list(module)
    return None


def _copy(out: Any) -> Any:
    if isinstance(out, torch.Tensor):
        return out.detach().clone()
    if type(out) is tuple:
        return tuple(_copy(o) for o in out)
    return out


def _stacked(out: Any, rows: int, copies: int) -> Any:
    """A recorded block output for `copies` stacked copies of its batch (copy c in rows c·B … (c+1)·B − 1), or
    None where an output tensor's first dimension is not the batch's `rows` (then the block runs)."""
    if copies == 1:
        return _copy(out)
    if isinstance(out, torch.Tensor):
        return out.repeat(copies, *([1] * (out.dim() - 1))) if out.dim() and out.shape[0] == rows else None
    if type(out) is tuple:
        parts = tuple(_stacked(o, rows, copies) for o in out)
        return None if any(p is None and o is not None for p, o in zip(parts, out)) else parts
    return None


def _replayable(out: Any) -> bool:
    """A block output that can be handed back as recorded: a tensor, or a plain tuple of tensors and None."""
    if isinstance(out, torch.Tensor):
        return True
    return type(out) is tuple and all(o is None or isinstance(o, torch.Tensor) for o in out)


def _bytes(out: Any) -> int:
    if isinstance(out, torch.Tensor):
        return out.numel() * out.element_size()
    return sum(_bytes(o) for o in out) if type(out) is tuple else 0


class _Call:
    """One recorded forward call of the base: its token ids and mask, and each block's output."""

    def __init__(self, ids: torch.Tensor | None, mask: torch.Tensor | None) -> None:
        self.ids, self.mask = ids, mask
        self.outputs: dict[int, Any] = {}

    def same_inputs(self, ids: torch.Tensor | None, mask: torch.Tensor | None, copies: int = 1) -> bool:
        """Whether a call is on this call's inputs (`copies` stacked copies of them, copy c in rows c·B … (c+1)·B − 1)."""
        def same(a, b):
            if (a is None) != (b is None):
                return False
            if a is None:
                return True
            if b.dim() == 0 or b.shape[0] != copies * a.shape[0] or b.shape[1:] != a.shape[1:]:
                return False
            return torch.equal(b.to(a.device).reshape(copies, *a.shape), a.expand(copies, *a.shape))
        return self.ids is not None and same(self.ids, ids) and same(self.mask, mask)


def _owner(base: torch.nn.Module, blocks: list[torch.nn.Module] | None) -> torch.nn.Module | None:
    """The module whose forward runs the blocks (it holds their `ModuleList`): every call into the layers passes
    it, also where a model's head calls an inner module directly (OPT's `model.decoder`, not `model`)."""
    if blocks is None:
        return None
    for module in base.modules():
        for child in module.children():
            if isinstance(child, torch.nn.ModuleList) and list(child) == blocks:
                return module
    return None


def _inputs(args: tuple, kwargs: dict) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """What a call into the blocks' owner is keyed by: its token ids, or the hidden states it is given (an
    encoder stack's input), and its mask."""
    ids = next((kwargs[k] for k in ("input_ids", "hidden_states", "inputs_embeds") if kwargs.get(k) is not None),
               args[0] if args else None)
    mask = kwargs.get("attention_mask")
    return (ids if isinstance(ids, torch.Tensor) else None), (mask if isinstance(mask, torch.Tensor) else None)


class CleanPrefix:
    """The clean outputs of every layer block, recorded once, replayed below an ablated layer (see the module).

    >>> from headscope.probe.tiny import tiny_model
    >>> from headscope.probe.interventions import ablate
    >>> lm = tiny_model("bert"); ids = lm.tokenizer(["The cat sat."], return_tensors="pt")["input_ids"]
    >>> run = lambda: lm.model(input_ids=ids).last_hidden_state
    >>> prefix = CleanPrefix(lm)
    >>> with torch.no_grad(), prefix.recording():
    ...     clean = run()
    >>> with torch.no_grad(), ablate(lm, [(1, 0)]):
    ...     whole, replayed = run(), prefix.read(run, 1)
    >>> torch.equal(whole, replayed), prefix.trusted
    (True, True)
    """

    def __init__(self, lm: LoadedModel, *, budget: int = REPLAY_BUDGET) -> None:
        self.lm, self.budget = lm, budget
        self.blocks = layer_blocks(lm)
        self.owner = _owner(base_model(lm), self.blocks)  # where each call into the blocks is seen
        if self.owner is None:
            self.blocks = None
        self.calls: list[_Call] = []
        self.trusted: bool | None = None  # None: not checked yet; False: replay differed, reads run whole
        self._size = 0

    @property
    def active(self) -> bool:
        """Whether reads may replay: blocks found, a recording within the budget, and no failed check."""
        return self.blocks is not None and bool(self.calls) and self.trusted is not False

    @contextmanager
    def recording(self) -> Iterator[None]:
        """Within the block, every forward call of the base is recorded (the clean read)."""
        self.calls, self._size = [], 0
        if self.blocks is None:
            yield
            return
        base = self.owner

        def start(_, call):
            if self.blocks is not None:  # not given up (over the budget)
                self.calls.append(_Call(*(None if t is None else t.detach().clone() for t in _inputs(*call))))

        def keep(layer, out):
            if not self.calls or self.blocks is None:
                return
            if not _replayable(out) or self._size + _bytes(out) > self.budget:
                self.blocks, self.calls = None, []  # nothing will be replayed
                return
            self._size += _bytes(out)
            self.calls[-1].outputs[layer] = _copy(out)

        with watch({"base": base}, start, what="arguments"), watch(dict(enumerate(self.blocks)), keep):
            yield

    @contextmanager
    def from_layer(self, layer: int, copies: int = 1) -> Iterator[None]:
        """Within the block, a forward call on recorded inputs replays the blocks below `layer` (in call order);
        with `copies`, a call on that many stacked copies of the recorded inputs gets as many copies of the outputs."""
        if not self.active or layer <= 0:
            yield
            return
        base = self.owner
        state: dict[str, Any] = {"n": 0, "call": None}

        def start(_, inputs):
            k = state["n"]
            state["n"] += 1
            call = self.calls[k] if k < len(self.calls) else None
            state["call"] = call if call is not None and call.same_inputs(*_inputs(*inputs), copies) else None

        def replay(i: int, block: torch.nn.Module):
            run = block.forward

            def forward(*args, **kwargs):
                call = state["call"]
                out = None if call is None or i not in call.outputs else _stacked(call.outputs[i], len(call.ids), copies)
                return run(*args, **kwargs) if out is None else out
            return forward

        replaced: list[torch.nn.Module] = []
        with watch({"base": base}, start, what="arguments"):
            try:
                below = self.blocks[:layer]
                if not any("forward" in vars(block) for block in below):  # a wrapper on the instance (accelerate): run whole
                    for i, block in enumerate(below):
                        block.forward = replay(i, block)
                        replaced.append(block)
                yield
            finally:
                for block in replaced:
                    del block.forward  # the instance attribute: the class's forward shows through again

    def read(self, fn: Callable[[], torch.Tensor], layer: int, copies: int = 1) -> torch.Tensor:
        """`fn()` (a readout, under an intervention of `layer` and later layers, its calls on `copies` stacked
        copies of the recorded inputs) with the blocks below `layer` replayed; the first read that replays
        anything is checked against a whole one."""
        if not self.active or layer <= 0:
            return fn()
        with self.from_layer(layer, copies):
            fast = fn()
        if self.trusted is None:
            whole = fn()
            self.trusted = bool(fast.shape == whole.shape and torch.allclose(fast, whole, rtol=1e-6, atol=1e-6))
            return whole
        return fast

