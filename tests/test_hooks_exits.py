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


def _broken_layer(lm, layer: int = 1):
    """Within the block, the forward pass raises `_Boom` on entering `layer`'s attention (a hook of the test's own,
    removed with the block)."""
    family = family_for(lm.config)
    return watch(LayerModules(family, base_model(lm), lm.config, [layer], "attention"), _boom, what="arguments")


# The probes that hook a pass of their own (no block of the caller's): the model's forward raises mid-pass.
PASSES = {
    "head_means": lambda lm: iv.head_means(lm, TEXTS),
    "extract": lambda lm: extract(lm, TEXTS),
    "recompute blocks": lambda lm: list(iter_blocks(lm, TEXTS[0], budget=2000)),
}


@pytest.mark.parametrize("name", sorted(PASSES))
def test_an_error_in_the_forward_of_a_probes_own_pass_leaves_no_hook(llama, name):
    PASSES[name](llama)  # transformers' recorders for what this pass asks (attention weights, say) installed
    hooks, state = _hooks(llama.model), _state(llama.model)
    with _broken_layer(llama), pytest.raises(_Boom):
        PASSES[name](llama)
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
