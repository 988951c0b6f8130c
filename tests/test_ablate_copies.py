"""Every head of a layer ablated in one pass (`probe.interventions.ablate_copies` on stacked copies of each batch,
`EffectTask.stacked`, `CleanPrefix` with `copies`), on tiny random models.

The reference is independent of the stacking and of `ablate`'s hooks: a whole pass of the model per head under
Michel et al.'s head mask (`head_mask`, the head's output times 0), on a batch that pads a short text to a long one.
"""

import dataclasses

import pytest
import torch

from headscope.probe.effects import logit_diff, next_token_loss, sentence_cosine, word_cosine
from headscope.probe.forward import attention_layers
from headscope.probe.interventions import ablate, ablate_copies, head_mask
from headscope.probe.replay import CleanPrefix
from headscope.probe.tiny import TINY_CORPUS, tiny_model
from headscope.workflows import ablation as workflow
from headscope.workflows.ablation import ablate_each

# lengths far apart within one batch (batch_size=3): the short ones are mostly padding
TEXTS = ["Hi.", " ".join(TINY_CORPUS[:3]), "The cat sat.", TINY_CORPUS[3], " ".join(TINY_CORPUS[4:6])]


def _lm_head(lm) -> bool:
    get = getattr(lm.model, "get_output_embeddings", None)
    return lm.is_causal and get is not None and get() is not None


def _measure(lm):
    return next_token_loss(lm, TEXTS, batch_size=3) if _lm_head(lm) else sentence_cosine(lm, TEXTS, batch_size=3)


def _masked(lm, measure, layer, head):
    """The readout of a whole pass with head (layer, head) multiplied by 0 (the head mask)."""
    xi = torch.ones(lm.config.num_hidden_layers, lm.config.num_attention_heads)
    xi[layer, head] = 0
    with head_mask(lm, xi):
        return measure.read(lm)


def _state(model) -> list:
    return [(name, "forward" in vars(m), list(m._forward_pre_hooks), list(m._forward_hooks))
            for name, m in model.named_modules()]


def test_stacked_copies_are_each_heads_own_pass(tiny):
    """Copy c of a stacked read (replayed below the layer, and whole) is the pass with head c masked alone,
    in every family (GQA, rotary, sliding windows, ALiBi, ...), on a batch padded far; the model is unchanged."""
    lm = tiny
    measure = _measure(lm)
    before = _state(lm.model)
    layers = attention_layers(lm)
    layer = layers[len(layers) // 2]
    heads = sorted({0, lm.config.num_attention_heads - 1, lm.config.num_attention_heads // 2})
    prefix = CleanPrefix(lm)
    with prefix.recording():
        measure.read(lm)
    with ablate_copies(lm, layer, heads):
        whole = measure.stacked(lm, len(heads))
        replayed = prefix.read(lambda: measure.stacked(lm, len(heads)), layer, copies=len(heads))
    assert whole.shape[:2] == (len(heads), len(TEXTS)) and torch.equal(replayed, whole)
    for c, head in enumerate(heads):
        torch.testing.assert_close(whole[c], _masked(lm, measure, layer, head), rtol=0, atol=1e-6)
    assert _state(lm.model) == before


@pytest.mark.parametrize("family, method", [("bert", "zero"), ("gpt2", "mean"), ("gemma3", "uniform"),
                                            ("llama", "zero")])
def test_ablate_each_stacked_equals_a_pass_per_head(family, method):
    """`ablate_each` (stacked, replayed) gives each head's effect of a whole pass under `ablate` of that head."""
    lm = tiny_model(family)
    frame = ablate_each(lm, corpus=TEXTS, batch_size=3, method=method)
    measure = _measure(lm)
    means = workflow._means(lm, method, TEXTS, None, 3)
    clean = measure.read(lm)
    assert len(frame) == lm.config.num_hidden_layers * lm.config.num_attention_heads
    for row in frame.itertuples():
        with ablate(lm, [(row.layer, row.head)], method=method, means=means):
            assert row.effect == pytest.approx(measure.change(clean, measure.read(lm)), abs=1e-6)
        if method == "zero" and row.head % 2 == 0:  # and, independently of the hooks, under the head mask
            assert row.effect == pytest.approx(measure.change(clean, _masked(lm, measure, row.layer, row.head)),
                                               abs=1e-6)


def test_every_stacked_task_reads_what_its_plain_read_reads():
    """`stacked(lm, k)` without an intervention: k copies of `read(lm)` for each task that has it."""
    gpt2, bert = tiny_model("gpt2"), tiny_model("bert")
    tasks = [(gpt2, next_token_loss(gpt2, TEXTS, batch_size=3)),
             (gpt2, logit_diff(gpt2, ["The cat", "A much longer prompt about the cat and the dog"], [" sat", " ran"],
                               [" is", " was"], batch_size=3)),
             (bert, sentence_cosine(bert, TEXTS, batch_size=3)), (bert, word_cosine(bert, TEXTS[1:4], "the", batch_size=2))]
    for lm, task in tasks:
        plain, stacked = task.read(lm), task.stacked(lm, 3)
        assert stacked.shape == (3, *plain.shape) and task.copy_bytes > 0
        for c in range(3):
            torch.testing.assert_close(stacked[c], plain, rtol=0, atol=1e-6)


def test_a_stacked_read_that_differs_falls_back_to_one_head_at_a_time(monkeypatch):
    """Were copies of a batch not independent (here: a stacked read made wrong on purpose), the check against
    the first head's own pass catches it, and every head is read alone, as before stacking."""
    lm = tiny_model("gpt2")
    calls = []
    real = workflow.effect_task

    def wrong(*args, **kwargs):
        task, settings = real(*args, **kwargs)

        def stacked(m, copies):
            calls.append(copies)
            return task.stacked(m, copies) + 1.0
        return dataclasses.replace(task, stacked=stacked), settings

    monkeypatch.setattr(workflow, "effect_task", wrong)
    frame = ablate_each(lm, method="zero", corpus=TEXTS, batch_size=3)
    assert calls == [lm.config.num_attention_heads]  # one stacked read, then none
    measure = _measure(lm)
    clean = measure.read(lm)
    for row in frame.itertuples():
        with ablate(lm, [(row.layer, row.head)]):
            assert row.effect == pytest.approx(measure.change(clean, measure.read(lm)), abs=1e-6)


def test_ablate_copies_says_what_is_wrong():
    lm = tiny_model("bert")
    before = _state(lm.model)
    ids = lm.tokenizer(["The cat sat."] * 3, return_tensors="pt")["input_ids"]
    with pytest.raises(ValueError, match="not 2 stacked copies"):
        with torch.no_grad(), ablate_copies(lm, 1, [0, 1]):
            lm.model(input_ids=ids)
    with pytest.raises(ValueError, match="out of range"):
        with ablate_copies(lm, 1, [0, lm.config.num_attention_heads]):
            pass
    with pytest.raises(ValueError, match="at least one head"):
        with ablate_copies(lm, 1, []):
            pass
    assert _state(lm.model) == before
