"""Replaying the clean layers below an ablated head (`probe.replay.CleanPrefix`), on tiny random models.

Expected values come from whole forward passes under the same ablation (the reads `ablate_each` made
before replay existed), so a replayed read must equal them; the model must be as it was afterwards.
"""

import pytest
import torch

from headscope.probe.effects import next_token_loss, sentence_cosine
from headscope.probe.families import family_for
from headscope.probe.forward import attention_layers, base_model
from headscope.probe.hooks import LayerModules, watch
from headscope.probe.interventions import ablate
from headscope.probe.replay import CleanPrefix, layer_blocks
from headscope.probe.tiny import TINY_CORPUS, tiny_model
from headscope.workflows.ablation import ablate_each

NOT_REPLAYED = {"albert", "gemma4"}  # one shared layer module; later layers read an earlier layer's keys and values
TEXTS = list(TINY_CORPUS[:5])  # batch_size=2 below: three forward calls, the last a single text


def _lm_head(lm) -> bool:
    get = getattr(lm.model, "get_output_embeddings", None)
    return lm.is_causal and get is not None and get() is not None


def _measure(lm):
    """What `ablate_each` reads: a decoder's next-token loss, else the sentence embedding (CLIP's text tower too)."""
    return next_token_loss(lm, TEXTS, batch_size=2) if _lm_head(lm) else sentence_cosine(lm, TEXTS, batch_size=2)


def _state(model) -> list:
    """What replay must leave as it was: every module's instance attributes named forward and its hooks."""
    return [(name, "forward" in vars(m), list(m._forward_pre_hooks), list(m._forward_hooks))
            for name, m in model.named_modules()]


def test_every_head_replayed_equals_a_whole_pass(tiny):
    """Each head's ablated readout with the layers below it replayed is the whole pass's, bit for bit
    (where replay applies: every family whose blocks are found), and the model is left as it was."""
    lm = tiny
    measure = _measure(lm)
    before = _state(lm.model)
    prefix = CleanPrefix(lm)
    with prefix.recording():
        clean = measure.read(lm)
    assert torch.equal(clean, measure.read(lm))  # recording changes nothing
    layers = attention_layers(lm)
    assert (prefix.blocks is None) == (family_for(lm.config).name in NOT_REPLAYED) and prefix.active == (prefix.blocks is not None)
    for layer in layers:
        for head in {0, lm.config.num_attention_heads - 1}:
            with ablate(lm, [(layer, head)]):
                whole = measure.read(lm)
                with prefix.from_layer(layer):
                    replayed = measure.read(lm)
            assert torch.equal(replayed, whole), (lm.name, layer, head)
    assert _state(lm.model) == before


@pytest.mark.parametrize("family", ["bert", "llama"])
def test_replay_runs_only_the_layers_from_the_ablated_one(family):
    lm = tiny_model(family)
    family, base = family_for(lm.config), base_model(lm)
    measure = _measure(lm)
    prefix = CleanPrefix(lm)
    with prefix.recording():
        measure.read(lm)
    ran = []
    last = max(attention_layers(lm))
    attention = LayerModules(family, base, lm.config, attention_layers(lm), "attention")
    with watch(attention, lambda l, call: ran.append(l), what="arguments"), ablate(lm, [(last, 0)]), \
            prefix.from_layer(last):
        measure.read(lm)
    assert set(ran) == {last} and len(ran) == 3  # three forward calls, each running the last layer alone


@pytest.mark.parametrize("family", ["bert", "gpt2", "gemma3"])
def test_ablate_each_keeps_its_numbers(family):
    """`ablate_each` (which replays) gives the effects of a loop of whole ablated passes."""
    lm = tiny_model(family)
    frame = ablate_each(lm, method="zero", corpus=TEXTS, batch_size=2)
    measure = _measure(lm)
    clean = measure.read(lm)
    for row in frame.head(3).itertuples():  # a few heads of each family: the first layer's
        with ablate(lm, [(row.layer, row.head)]):
            assert row.effect == measure.change(clean, measure.read(lm))
    for row in frame.tail(2).itertuples():  # and the last layer's
        with ablate(lm, [(row.layer, row.head)]):
            assert row.effect == measure.change(clean, measure.read(lm))


def test_a_replay_that_differs_falls_back_to_whole_passes():
    """A recorded output that is not what the layer gives (as if a layer passed on more than its output):
    the first replayed read is checked against a whole one, and every read after runs whole."""
    lm = tiny_model("gpt2")
    measure = _measure(lm)
    prefix = CleanPrefix(lm)
    with prefix.recording():
        measure.read(lm)
    for call in prefix.calls:  # not a constant shift, which the next LayerNorm would take out again
        out = call.outputs[0]
        call.outputs[0] = out + torch.linspace(0, 1, out.shape[-1])
    with ablate(lm, [(1, 0)]):
        whole = measure.read(lm)
        first = prefix.read(lambda: measure.read(lm), 1)
        second = prefix.read(lambda: measure.read(lm), 1)
    assert prefix.trusted is False and not prefix.active
    assert torch.equal(first, whole) and torch.equal(second, whole)


def test_other_inputs_budget_and_errors_run_whole():
    lm = tiny_model("llama")
    measure = _measure(lm)
    before = _state(lm.model)
    small = CleanPrefix(lm, budget=0)  # nothing fits: nothing is recorded or replayed
    with small.recording():
        measure.read(lm)
    assert small.calls == [] and not small.active
    prefix = CleanPrefix(lm)
    with prefix.recording():
        measure.read(lm)
    other = sentence_cosine(lm, ["A wholly different text to read."], batch_size=2)  # ids never recorded
    with ablate(lm, [(1, 0)]):
        whole = other.read(lm)
        with prefix.from_layer(1):
            assert torch.equal(other.read(lm), whole)
    with pytest.raises(RuntimeError, match="boom"):
        with prefix.from_layer(1):
            raise RuntimeError("boom")
    assert _state(lm.model) == before


def test_layer_blocks_are_the_layers_in_order():
    lm = tiny_model("llama")
    family, base = family_for(lm.config), base_model(lm)
    blocks = layer_blocks(lm)
    assert len(blocks) == lm.config.num_hidden_layers
    assert all(any(m is family.attention(base, i) for m in b.modules()) for i, b in enumerate(blocks))
