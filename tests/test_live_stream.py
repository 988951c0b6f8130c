"""Issue 38: the live explorer's recomputed text streams its forward pass. The first view of layer L runs the
layers up to L and no further; a later layer continues the same pass; the layers passed are read back from
the text's own temporary folder (removed with the text); the model is as it was loaded while the pass
waits. References: the eager map of the same text (`probe.extract`), and calls counted by hooks."""

from __future__ import annotations

import gc
import threading
from collections import Counter

import pytest
import torch

from headscope.probe import live as live_mod
from headscope.probe.encoding import encode
from headscope.probe.extract import extract
from headscope.probe.families import family_for
from headscope.probe.forward import base_model
from headscope.probe.hooks import LayerModules, watch
from headscope.probe.sources import source_for
from headscope.probe.tiny import tiny_model

TEXT = "The cat sat on the mat. Photosynthesis seems extraordinary, doesn't it? The dog barked twice."
OTHER = "A second text, read eagerly while the first one's pass waits."


@pytest.fixture(scope="module")
def deep():
    """A 4-layer tiny llama: room for layers before and after the one asked for."""
    return tiny_model("llama", num_hidden_layers=4)


def _counted(lm):
    """Within the block, calls of each layer's attention counted (a forward pre-hook on every attention module)."""
    calls: Counter = Counter()
    layers = list(range(lm.config.num_hidden_layers))
    return calls, watch(LayerModules(family_for(lm.config), base_model(lm), lm.config, layers, "attention"),
                        lambda i, call: calls.update([i]), what="arguments")


def _live(lm, text=TEXT, **kw):
    source = source_for(lm, "recompute")
    source.checked(encode(lm, text))  # the prefix check's own passes out of the counts
    return source.live(text, **kw)


def test_the_first_view_of_a_layer_runs_no_layer_after_it_and_a_later_layer_continues_the_pass(deep):
    [m] = extract(deep, TEXT)
    live = _live(deep)
    calls, counting = _counted(deep)
    try:
        with counting:
            blocks = list(live.blocks(1, 2))  # the explorer's overview of L1H2: every row of the head
            assert set(calls) == {0, 1} and calls[0] == 1  # layers 2 and 3 never ran
            torch.testing.assert_close(torch.cat([b.probs[0] for b in blocks]), m.attention[1, 2], atol=1e-6, rtol=0)
            torch.testing.assert_close(live.rows(3, 0, 2, 5), m.attention[3, 0, 2:5], atol=1e-6, rtol=0)
            assert calls == Counter({0: 1, 1: 1, 2: 1, 3: 1})  # the same pass went on from layer 1 to layer 3
            for layer in (0, 2, 1):  # layers passed: read back, no forward pass
                torch.testing.assert_close(live.rows(layer, 3, 0, len(live)), m.attention[layer, 3], atol=1e-6,
                                           rtol=0)
            assert calls == Counter({0: 1, 1: 1, 2: 1, 3: 1})
    finally:
        live.close()


def test_the_model_is_as_loaded_while_the_pass_waits(deep):
    before = extract(deep, OTHER)[0].attention
    live = _live(deep)
    live.rows(1, 0, 0, 3)  # the pass now waits in layer 1, its hooks still in place
    try:
        assert deep.config._attn_implementation == "eager"
        torch.testing.assert_close(extract(deep, OTHER)[0].attention, before, atol=0, rtol=0)  # other calls pass through
        [m] = extract(deep, TEXT)
        torch.testing.assert_close(live.rows(2, 1, 0, 4), m.attention[2, 1, :4], atol=1e-6, rtol=0)  # and it goes on
    finally:
        live.close()


def test_a_dropped_or_closed_text_ends_its_pass_and_removes_its_folder(deep):
    threads = threading.active_count()
    hooks = sum(len(mod._forward_pre_hooks) for mod in deep.model.modules())
    live = _live(deep)
    live.rows(2, 0, 0, 3)
    folder = live._caught.folder
    assert folder is not None and sorted(p.name for p in folder.iterdir()) == ["layer0.pt", "layer1.pt", "layer2.pt"]
    assert threading.active_count() == threads + 1  # the pass, waiting in layer 2
    del live
    gc.collect()
    assert not folder.exists() and threading.active_count() == threads
    assert sum(len(mod._forward_pre_hooks) for mod in deep.model.modules()) == hooks
    live = _live(deep)
    [m] = extract(deep, TEXT)
    live.rows(3, 0, 0, 3)
    folder = live._caught.folder
    live.close()
    assert not folder.exists() and threading.active_count() == threads
    torch.testing.assert_close(live.rows(1, 0, 0, 3), m.attention[1, 0, :3], atol=1e-6, rtol=0)  # still answers
    live.close()


def test_without_room_on_disk_a_layer_passed_is_caught_again(deep, monkeypatch):
    def full(*a, **kw):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(live_mod.tempfile, "mkdtemp", full)
    passes = []
    real = live_mod.streamed_inputs
    monkeypatch.setattr(live_mod, "streamed_inputs", lambda *a, **kw: passes.append(a[3]) or real(*a, **kw))
    [m] = extract(deep, TEXT)
    live = _live(deep, keep_layers=1)
    try:
        for layer in (2, 3, 0):  # 0 is neither in memory (one layer kept) nor on disk: a second pass
            torch.testing.assert_close(live.rows(layer, 1, 0, 4), m.attention[layer, 1, :4], atol=1e-6, rtol=0)
        assert len(passes) == 2 and live._caught.folder is None
    finally:
        live.close()


@pytest.mark.parametrize("family", ["gemma3", "gemma4", "bert"])
def test_streamed_rows_equal_the_eager_map(family):
    """Sliding windows (gemma3), shared KV read from a producer layer's input (gemma4), bidirectional (bert)."""
    lm = tiny_model(family)
    [m] = extract(lm, TEXT)
    live = _live(lm, keep_layers=1)
    try:
        n, layers = len(live), list(m.layer_ids)
        for layer in reversed(layers):  # the last layer first: the others are read back from disk
            got = torch.cat([b.probs[0] for b in live.blocks(layer, 0)])
            torch.testing.assert_close(got, m.attention[layers.index(layer), 0], atol=1e-6, rtol=0)
        assert live.rows(layers[0], 1, 0, n).shape == (n, n)
    finally:
        live.close()


def test_a_pass_that_fails_is_started_again_by_the_next_request(deep, monkeypatch):
    [m] = extract(deep, TEXT)
    live = _live(deep)
    real, failing = live_mod.streamed_inputs, [True]

    def flaky(*a, **kw):
        for i, x in real(*a, **kw):
            if i == 2 and failing:
                failing.clear()
                raise KeyboardInterrupt  # the user stopped the server mid-pass
            yield i, x

    monkeypatch.setattr(live_mod, "streamed_inputs", flaky)
    try:
        with pytest.raises(KeyboardInterrupt):
            live.rows(3, 0, 0, 3)
        assert live._caught.stream is None  # the failed pass was ended, its worker gone
        assert not any(t.name == "headscope-layer-inputs" for t in threading.enumerate())
        torch.testing.assert_close(live.rows(3, 0, 0, 3), m.attention[3, 0, :3], atol=1e-6, rtol=0)
    finally:
        live.close()
