"""Every probe that hooks a forward pass through `probe/hooks.py` leaves the model as it found it when something
raises: inside its block, inside one of its own hooks (mid-pass), or in the model's forward. Afterwards no module
holds a hook of ours (the model's own, transformers' output recorders, are compared before and after) and every
parameter and buffer is bit for bit what it was."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import _tiny

from headscope.probe import interventions as iv
from headscope.probe.encoding import encode_many, pad_batch
from headscope.probe.extract import extract
from headscope.probe.families import family_for
from headscope.probe.forward import base_model
from headscope.probe.hooks import LayerModules, watch
from headscope.probe.image_cross import image_cross_attention
from headscope.probe.kvplan import KVPlan
from headscope.probe.longcontext import stream_heads
from headscope.probe.recompute import iter_blocks
from headscope.probe.replay import CleanPrefix
from headscope.workflows.mechanisms import attribution_patch, patch

TEXTS = ["The cat sat on the mat, and the dog sat on the log!", "Mary told John."]


class _Boom(Exception):
    pass


def _boom(*_):
    raise _Boom


def _hooks(model) -> list:
    return [(name, list(m._forward_pre_hooks), list(m._forward_hooks)) for name, m in model.named_modules()]


def _state(model) -> dict:
    return {name: t.detach().clone() for name, t in model.state_dict().items()}


def _same_state(model, before: dict) -> bool:
    now = model.state_dict()
    return now.keys() == before.keys() and all(torch.equal(now[k], before[k]) for k in before)


def _batch(lm, copies: int = 1):
    ids, mask = pad_batch(encode_many(lm, TEXTS), lm.device)
    return {"input_ids": ids.repeat(copies, 1), "attention_mask": mask.repeat(copies, 1), "use_cache": False}


def _run(lm, copies: int = 1):
    with torch.no_grad():
        return base_model(lm)(**_batch(lm, copies)).last_hidden_state


@pytest.fixture
def llama():
    lm = _tiny("llama")
    _run(lm)  # transformers installs its own recorder hooks on a first call: before the snapshot
    return lm


def _model_as_it_was(lm, hooks, state):
    assert _hooks(lm.model) == hooks  # every hook of ours removed
    assert _same_state(lm.model, state)  # no weight or buffer touched


# Each context, entered on tiny llama; `copies`: the stacked copies of the batch its forward call takes.
CONTEXTS = {
    "ablate zero": (lambda lm: iv.ablate(lm, [(0, 1), (1, 2)]), 1),
    "ablate mean": (lambda lm: iv.ablate(lm, [(1, 2)], method="mean", means=iv.head_means(lm, TEXTS)), 1),
    "ablate uniform": (lambda lm: iv.ablate(lm, [(0, 1), (1, 2)], method="uniform"), 1),
    "ablate_copies": (lambda lm: iv.ablate_copies(lm, 1, [0, 3], method="uniform"), 2),
    "head_mask": (lambda lm: iv.head_mask(lm, torch.rand(2, 4, requires_grad=True)), 1),
    "stream_heads": (lambda lm: stream_heads(lm, [KVPlan(np.array([[True, False], [False, True]]), sink=1, recent=2),
                                                  KVPlan(np.array([[False, True], [True, True]]), sink=2, recent=1)]), 2),
    "replay recording": (lambda lm: CleanPrefix(lm).recording(), 1),
}


@pytest.mark.parametrize("name", sorted(CONTEXTS))
def test_an_error_inside_the_block_leaves_no_hook(llama, name):
    enter, copies = CONTEXTS[name]
    hooks, state, clean = _hooks(llama.model), _state(llama.model), _run(llama, copies)
    with pytest.raises(_Boom):
        with enter(llama):
            assert _hooks(llama.model) != hooks  # the context did hook the model
            _run(llama, copies)  # its hooks ran
            raise _Boom
    _model_as_it_was(llama, hooks, state)
    assert torch.equal(_run(llama, copies), clean)


@pytest.mark.parametrize("name", ["ablate_copies", "stream_heads"])
def test_an_error_raised_by_a_hook_mid_pass_leaves_no_hook(llama, name):
    """Both refuse, from inside their hook, a batch that is not their number of stacked copies."""
    enter, copies = CONTEXTS[name]
    hooks, state = _hooks(llama.model), _state(llama.model)
    with enter(llama), pytest.raises(ValueError, match="stacked copies"), torch.no_grad():
        base_model(llama)(input_ids=_batch(llama)["input_ids"][:1].repeat(2 * copies + 1, 1), use_cache=False)
    _model_as_it_was(llama, hooks, state)


def test_replaying_from_a_layer_leaves_no_hook_and_no_forward_after_an_error(llama):
    prefix = CleanPrefix(llama)
    with prefix.recording():
        _run(llama)
    hooks, state = _hooks(llama.model), _state(llama.model)
    with pytest.raises(_Boom):
        with prefix.from_layer(1):
            _run(llama)
            raise _Boom
    _model_as_it_was(llama, hooks, state)
    assert not any("forward" in vars(m) for m in llama.model.modules())  # the replayed blocks' own forward gone


def _total(model) -> int:
    return sum(len(m._forward_pre_hooks) + len(m._forward_hooks) for m in model.modules())


def _broken_layer(lm, layer: int = 1, nth: int = 1, held: list | None = None):
    """Within the block, the forward pass raises `_Boom` on entering `layer`'s attention for the `nth` time (a hook
    of the test's own, removed with the block); `held` gets the number of hooks the model holds then."""
    family, calls = family_for(lm.config), []

    def count(key, call):
        calls.append(key)
        if len(calls) == nth:
            if held is not None:
                held.append(_total(lm.model))
            raise _Boom

    return watch(LayerModules(family, base_model(lm), lm.config, [layer], "attention"), count, what="arguments")


# The probes that hook passes of their own (no block of the caller's): the model's forward raises mid-pass, in the
# pass given (patching: passes 1 and 2 are the clean and corrupt metrics, 3 the source run, 4 the first patched run;
# path patching's 3 and 4 are its source runs, 5 its frozen run; attribution's 4 the pass it differentiates).
PASSES = {
    "head_means": (lambda lm: iv.head_means(lm, TEXTS), 1),
    "extract": (lambda lm: extract(lm, TEXTS), 1),
    "recompute blocks": (lambda lm: list(iter_blocks(lm, TEXTS[0], budget=2000)), 1),
    "patch source": (lambda lm: patch(lm, "ioi", what="mlp", n_random=1), 3),
    "patch mlp": (lambda lm: patch(lm, "ioi", what="mlp", n_random=1), 4),
    "patch head_out": (lambda lm: patch(lm, "ioi", what="head_out", n_random=1), 4),
    "patch q": (lambda lm: patch(lm, "ioi", what="q", n_random=1), 4),
    "patch resid": (lambda lm: patch(lm, "ioi", what="resid", n_random=1), 4),
    "path patch": (lambda lm: patch(lm, "ioi", what="path", sender=(0, 1), freeze_mlps=True, n_random=1), 5),
    "attribution resid": (lambda lm: attribution_patch(lm, "ioi", what="resid", compare=False), 4),
}


@pytest.mark.parametrize("name", sorted(PASSES))
def test_an_error_in_the_forward_of_a_probes_own_pass_leaves_no_hook(llama, name):
    run, nth = PASSES[name]
    run(llama)  # transformers' recorders for what this pass asks (attention weights, say) installed
    hooks, state, held = _hooks(llama.model), _state(llama.model), []
    with _broken_layer(llama, nth=nth, held=held), pytest.raises(_Boom):
        run(llama)
    assert held[0] > _total(llama.model) + 1  # it raised while the probe's hooks were in place (and ours)
    _model_as_it_was(llama, hooks, state)


def test_image_cross_attention_leaves_no_hook_after_an_error():
    lm = _tiny("mllama")
    picture = np.random.default_rng(0).random((16, 30, 3))
    image_cross_attention(lm, "<|image|> a cat", images=[picture])  # the model's own recorders installed
    hooks, state = _hooks(lm.model), _state(lm.model)
    reading = family_for(lm.config).vision_language
    cross = reading.cross.layer_numbers(lm.config)[0]
    with watch({"cross": reading.cross.attention(base_model(lm), cross)}, _boom), pytest.raises(_Boom):
        image_cross_attention(lm, "<|image|> a cat", images=[picture])
    _model_as_it_was(lm, hooks, state)


class _VisionAttention(torch.nn.Module):
    """A vision attention as Qwen-VL's towers call it: hidden states by keyword, the segments as `cu_seqlens`."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(4, 4)

    def forward(self, hidden_states, cu_seqlens=None):
        return self.proj(hidden_states)


def test_vision_calls_catch_each_layer_and_leave_no_hook_when_the_tower_raises():
    from headscope.probe.qwen_vision import vision_calls

    torch.manual_seed(0)
    layers, x, cu = [_VisionAttention(), _VisionAttention()], torch.randn(5, 4), torch.tensor([0, 2, 5])

    def run(fail: bool = False):
        h = layers[0](hidden_states=x, cu_seqlens=cu)
        if fail:
            raise _Boom
        layers[1](hidden_states=h)

    ins, cus, outs = vision_calls(run, layers, [a.proj for a in layers])
    first = layers[0].proj(x).detach()  # by hand: layer 1 reads layer 0's output and is given no segments
    assert torch.equal(ins[0], x) and torch.equal(outs[0], first) and torch.equal(ins[1], first)
    assert torch.equal(outs[1], layers[1].proj(first)) and cus[0] is cu and cus[1] is None
    with pytest.raises(_Boom):
        vision_calls(lambda: run(fail=True), layers, [a.proj for a in layers])
    assert all(not m._forward_hooks and not m._forward_pre_hooks for a in layers for m in a.modules())
