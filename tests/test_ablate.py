"""Zero ablation on a whole layer, and the choice check (cloze preferences and their flips), on tiny
random models with known answers: the old `probe/ablate.py` tests, run on `probe.interventions`."""

import pytest
import torch

from headscope.workflows.ablation import Choice, choice_check
from headscope.analyses.ablation import ChoiceCheck
from headscope.probe.effects import option_logprobs
from headscope.probe.forward import base_model
from headscope.probe.families import family_for
from headscope.probe.interventions import ablate
from headscope.probe.tiny import tiny_model


@pytest.fixture(scope="module")
def llama():
    return tiny_model("llama")


def _ids(lm, text="The cat sat on the mat."):
    return torch.tensor([lm.tokenizer(text)["input_ids"]])


def _out_proj(lm, layer):
    return family_for(lm.config).out_proj(base_model(lm), layer)


def test_ablating_every_head_of_a_layer_silences_its_attention(llama):
    seen = {}
    handle = _out_proj(llama, 0).register_forward_hook(lambda m, a, out: seen.__setitem__("output", out.clone()))
    try:
        with torch.no_grad(), ablate(llama, [(0, h) for h in range(4)]):
            llama.model(input_ids=_ids(llama))
    finally:
        handle.remove()
    assert (seen["output"] == 0).all()  # Llama's o_proj has no bias


def test_later_layers_change_earlier_ones_do_not(llama):
    with torch.no_grad():
        clean = llama.model(input_ids=_ids(llama), output_hidden_states=True).hidden_states
        with ablate(llama, [(1, 0)]):
            ablated = llama.model(input_ids=_ids(llama), output_hidden_states=True).hidden_states
    torch.testing.assert_close(ablated[1], clean[1])  # after layer 0: unchanged
    assert not torch.allclose(ablated[2], clean[2])  # after layer 1: changed


def test_bad_heads_and_models_say_what_is_wrong(llama):
    with pytest.raises(ValueError, match="out of range"):
        with ablate(llama, [(5, 0)]):
            pass
    with pytest.raises(ValueError, match="needs a decoder with a language-model head"):
        option_logprobs(tiny_model("bert"), ["a"], [[" b", " c"]])
    with pytest.raises(ValueError, match="at least two options"):
        choice_check(llama, [(0, 0)], Choice(("a",), ((" b",),), (0,)))


def test_option_logprobs_match_a_direct_computation():
    lm = tiny_model("gpt2")
    prompt, options = "The cat sat on the", [" mat", " dog sat", " log"]
    got = option_logprobs(lm, [prompt, prompt], [options, options[:1]], batch_size=2)
    for opt, value in zip(options, got[0]):
        p_ids = lm.tokenizer(prompt)["input_ids"]
        o_ids = lm.tokenizer(opt, add_special_tokens=False)["input_ids"]
        full = torch.tensor([p_ids + o_ids])
        with torch.no_grad():
            lp = torch.log_softmax(lm.model(input_ids=full).logits[0], dim=-1)
        expected = sum(float(lp[len(p_ids) - 1 + j, t]) for j, t in enumerate(o_ids))
        assert value == pytest.approx(expected, abs=1e-4)
    assert got[1] == pytest.approx(got[0][:1])


PROMPTS = ["Mary told John that she left. She is", "The dog chased the cat. It was"]
OPTIONS = [(" Mary", " John"), (" the dog", " the cat")]
ANSWERS = [0, 1]


def _preference_by_hand(logps):
    # log P(right) - log P(the other option), two options per prompt, answers 0 and 1
    return [logps[0][0] - logps[0][1], logps[1][1] - logps[1][0]]


CHOICE = Choice(tuple(PROMPTS), tuple(OPTIONS), tuple(ANSWERS))


def _silence_heads_except(lm, keep: set[tuple[int, int]]):
    """Zero the output-projection columns of every head not in `keep`: ablating one of them changes nothing."""
    hd = lm.config.head_dim
    with torch.no_grad():
        for layer in range(lm.config.num_hidden_layers):
            proj = _out_proj(lm, layer)
            for h in range(lm.config.num_attention_heads):
                if (layer, h) not in keep:
                    proj.weight[:, h * hd : (h + 1) * hd] = 0


def test_ablation_check_against_heads_that_cannot_matter():
    # Only L1H3 writes to the residual stream; every random set ablates heads whose output is
    # multiplied by zero columns, so each random delta is exactly 0. With ties counted as "at least
    # as large a drop", p = 1/(1+n) when ablating L1H3 lowers the preference, and 1 otherwise.
    lm = tiny_model("llama", seed=3)
    _silence_heads_except(lm, {(1, 3)})
    n_random = 4
    check = choice_check(lm, [(1, 3)], CHOICE, method="zero", n_random=n_random, seed=1)
    before = _preference_by_hand(option_logprobs(lm, PROMPTS, OPTIONS))
    with ablate(lm, [(1, 3)]):
        after = _preference_by_hand(option_logprobs(lm, PROMPTS, OPTIONS))
    expected_delta = sum(a - b for a, b in zip(after, before)) / 2
    assert check.n == 2 and check.heads == ((1, 3),) and check.random_deltas == (0.0,) * n_random
    assert check.to_dict()["preference_before"] == pytest.approx(sum(before) / 2)
    assert check.delta == pytest.approx(expected_delta) and abs(check.delta) > 1e-4
    assert check.p_value == (1 / (1 + n_random) if check.delta < 0 else 1.0)
    assert check.verdict.startswith("ablating L1H3 moves the preference")
    assert check.to_dict()["heads"] == [{"layer": 1, "head": 3}]
    flipped = sum((b > 0) != (a > 0) for b, a in zip(before, after))
    assert check.flips == flipped and check.random_flips == (0,) * n_random
    assert check.flips_p_value == (1 / (1 + n_random) if flipped else 1.0)


def test_ablation_check_when_no_head_can_matter():
    # Every head's output columns are zero: no ablation changes anything, all deltas tie at 0 and
    # the p-value (1 + #ties) / (1 + n) is exactly 1.
    lm = tiny_model("llama", seed=3)
    _silence_heads_except(lm, set())
    check = choice_check(lm, [(0, 1), (1, 2)], CHOICE, method="zero", n_random=3, seed=0)
    assert check.delta == 0.0 and check.random_deltas == (0.0, 0.0, 0.0) and check.p_value == 1.0
    assert check.after == check.before and check.flips == 0 and check.flips_p_value == 1.0
    assert check.verdict.endswith("not a larger drop than random heads give (p = 1).")


def test_flips_count_sign_changes_and_compare_with_the_random_sets():
    # Hand-built preferences: example 0 flips (+ to -), example 1 stays -, example 2 flips (- to +).
    c = ChoiceCheck(model="m", heads=((2, 1),), method="zero", before=(1.0, -1.0, -0.5), after=(-1.0, -2.0, 0.5),
                    random_after=((1.0, -1.0, -0.5), (-1.0, -1.0, -0.5), (-1.0, 1.0, 0.5)))
    assert c.flips == 2 and c.random_flips == (0, 1, 3)
    assert c.flips_p_value == (1 + 1) / (1 + 3)  # only the third random set flips as many
    assert c.delta == pytest.approx((-2 - 1 + 1) / 3)
    assert c.flips_verdict.startswith("ablating L2H1 (zero) flips 2/3 cloze preferences; random 1-head ablations "
                                      "flip 1.3 ± 1.5 (p = 0.5, 3 draws)")
