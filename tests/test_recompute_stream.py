"""Issue 26's speed and memory mechanics of recompute mode: blocks written into reused buffers
(`probe.blocks.Buffers`), the forward streamed one layer at a time from a worker thread, and word
blocks that hold only the words their keys reach. References are blocks computed with nothing reused
and the whole map's word level (`probe.words.to_word_level`)."""

from __future__ import annotations

import threading

import pytest
import torch

from headscope.analyses.blocks import word_blocks
from headscope.probe import recompute
from headscope.probe.blocks import Block, Buffers
from headscope.probe.recompute import iter_blocks
from headscope.probe.words import to_word_level

from conftest import _tiny

TEXT = "The cat sat on the mat. Photosynthesis seems extraordinary, doesn't it? The dog barked twice."


def _hooks(lm) -> int:
    return sum(len(m._forward_pre_hooks) + len(m._forward_hooks) for m in lm.model.modules())


def test_buffers_reuse_only_what_nobody_holds():
    like = torch.zeros(1)
    buffers = Buffers()
    a = buffers.take((2, 3), like)
    b = buffers.take((2, 3), like)
    held = buffers.take((2, 3), like)  # `a` is alive: a fresh tensor, `a` keeps its values
    assert held.data_ptr() != a.data_ptr()
    del a, held
    b.fill_(7.0)
    again = buffers.take((3, 2), like)  # the turn of the buffer behind `held`, let go: written over
    assert again.shape == (3, 2) and again.data_ptr() != b.data_ptr()
    assert torch.equal(b, torch.full((2, 3), 7.0))  # the other buffer is untouched
    bigger = buffers.take((4, 4), like)  # the turn of `b`'s buffer, still held and too small: fresh
    assert bigger.data_ptr() != b.data_ptr() and bigger.shape == (4, 4)


def test_kept_blocks_are_not_written_over():
    # a consumer that keeps every block (list) gets the very values a streaming consumer sees one by one
    lm = _tiny("llama")
    streamed = [(b.layer, b.query_start, b.band.clone()) for b in iter_blocks(lm, TEXT, budget=2000)]
    kept = list(iter_blocks(lm, TEXT, budget=2000))
    assert len(kept) == len(streamed) > 2 * len(recompute.attention_layers(lm))  # several blocks per layer
    for block, (layer, start, band) in zip(kept, streamed):
        assert (block.layer, block.query_start) == (layer, start)
        assert torch.equal(block.band, band)


def test_the_stream_leaves_no_thread_or_hook_and_lets_the_model_be_used_meanwhile():
    lm = _tiny("llama")
    threads, hooks, implementation = threading.active_count(), _hooks(lm), lm.model.config._attn_implementation
    blocks = iter_blocks(lm, TEXT, budget=2000)
    first = next(blocks)
    alone = [b.band.clone() for b in iter_blocks(lm, "A short one.", budget=2000)]  # the model, mid-stream
    assert first.query_start == 0 and alone
    blocks.close()  # stopped after one block: the worker unwinds, its hooks go
    assert threading.active_count() == threads and _hooks(lm) == hooks
    assert lm.model.config._attn_implementation == implementation  # restored


def test_an_error_in_the_forward_reaches_the_caller(monkeypatch):
    lm = _tiny("llama")
    threads, hooks = threading.active_count(), _hooks(lm)

    def broken(model, implementation="sdpa"):
        raise RuntimeError("the forward failed")

    monkeypatch.setattr(recompute, "fast_attention", broken)
    with pytest.raises(RuntimeError, match="the forward failed"):
        list(iter_blocks(lm, TEXT))
    assert threading.active_count() == threads and _hooks(lm) == hooks


@pytest.mark.parametrize("family", ["gemma3", "mistral"])
def test_word_blocks_of_a_sliding_band_start_at_its_first_word(family):
    # one row per block: a sliding-window layer's rows see only the last few keys, so its word blocks
    # begin past word 0; their values are the whole map's word level all the same
    lm = _tiny(family)
    spec_windows = [getattr(lm.config, "sliding_window", None)]
    if not spec_windows[0]:
        pytest.skip(f"{family}'s tiny config has no sliding window")
    from headscope.probe.extract import extract

    [full] = extract(lm, TEXT)
    words = to_word_level(full).attention  # [layer, head, word, word]
    got = torch.full_like(words, float("nan"))
    starts = []
    for b in word_blocks(iter_blocks(lm, TEXT, budget=1), full.word_index):
        assert isinstance(b, Block)
        got[full.layer_ids.index(b.layer), :, b.query_start : b.query_stop] = b.probs
        starts.append(b.key_start)
    torch.testing.assert_close(got, words, atol=1e-6, rtol=0)
    assert max(starts) > 0  # some word block left the words before its band out


@pytest.mark.parametrize("family", ["llama", "gemma3", "qwen2", "gpt2", "bert"])
def test_caught_projections_give_the_blocks_of_projections_made_again(family, monkeypatch):
    # Issue 38: where q and k are plain nn.Linear modules of the attention, their outputs are caught in the
    # model's forward, not projected again; the blocks are those of q and k projected from the caught input
    # (within float32 rounding), and no hook is left on the model
    lm = _tiny(family)
    hooks, given = _hooks(lm), []
    real = recompute.project_qk
    monkeypatch.setattr(recompute, "project_qk", lambda *a, **kw: given.append(kw["projected"] is not None)
                        or real(*a, **kw))
    caught = [b.band.clone() for b in iter_blocks(lm, TEXT, budget=2000)]
    assert _hooks(lm) == hooks
    assert given == [family != "gpt2"] * len(recompute.attention_layers(lm))  # every layer's own q and k
    base, fam = recompute.base_model(lm), recompute.family_for(lm.config)
    found = [recompute._projections(fam, base, layer, fam.layer_spec(base, layer, lm.config))
             for layer in recompute.attention_layers(lm)]
    assert all(f is not None for f in found) == (family != "gpt2")  # GPT-2's fused c_attn: nothing to catch
    monkeypatch.setattr(recompute, "_projections", lambda *a: None)
    again = [b.band for b in iter_blocks(lm, TEXT, budget=2000)]
    assert len(caught) == len(again)
    assert max((a - b).abs().max().item() for a, b in zip(caught, again)) <= 1e-6


def test_a_stream_stopped_between_a_layers_projections_leaves_no_hook():
    lm = _tiny("llama")
    threads, hooks = threading.active_count(), _hooks(lm)
    blocks = iter_blocks(lm, TEXT, layers=[0, 1], budget=2000)
    assert next(blocks).layer == 0
    blocks.close()
    assert threading.active_count() == threads and _hooks(lm) == hooks
