"""Head ablation and the causal check, on tiny random models with known answers."""

import pytest
import torch

from headscope.probe.ablate import ablate_heads, causal_check, option_logprobs, output_projections
from headscope.probe.families import FAMILIES
from headscope.probe.tiny import tiny_model


@pytest.fixture(scope="module")
def llama():
    return tiny_model("llama")


def _ids(lm, text="The cat sat on the mat."):
    return torch.tensor([lm.tokenizer(text)["input_ids"]])


def _capture(module):
    seen = {}

    def hook(mod, args, output):
        seen["input"], seen["output"] = args[0].detach().clone(), output.detach().clone()

    return seen, module.register_forward_hook(hook)


@pytest.mark.parametrize("family", sorted(n for n, f in FAMILIES.items() if f.kind != "encoder-decoder"))
def test_ablation_zeroes_exactly_the_heads_slice(family):
    lm = tiny_model(family)
    proj = output_projections(lm)
    assert sorted(proj) == list(range(lm.config.num_hidden_layers))
    hd = getattr(lm.config, "head_dim", None) or lm.config.hidden_size // lm.config.num_attention_heads
    seen, handle = _capture(proj[1])
    try:
        with torch.no_grad():
            lm.model(input_ids=_ids(lm))
            clean = seen["input"]
            with ablate_heads(lm, [(1, 2)]):
                lm.model(input_ids=_ids(lm))
            ablated = seen["input"]
            lm.model(input_ids=_ids(lm))
            restored = seen["input"]
    finally:
        handle.remove()
    assert (ablated[..., 2 * hd : 3 * hd] == 0).all() and not (clean[..., 2 * hd : 3 * hd] == 0).all()
    torch.testing.assert_close(ablated[..., : 2 * hd], clean[..., : 2 * hd])  # layer 1's input is untouched
    torch.testing.assert_close(ablated[..., 3 * hd :], clean[..., 3 * hd :])
    torch.testing.assert_close(restored, clean)  # the hook is gone after the block


def test_ablating_every_head_of_a_layer_silences_its_attention(llama):
    proj = output_projections(llama)
    seen, handle = _capture(proj[0])
    try:
        with torch.no_grad(), ablate_heads(llama, [(0, h) for h in range(4)]):
            llama.model(input_ids=_ids(llama))
    finally:
        handle.remove()
    assert (seen["output"] == 0).all()  # Llama's o_proj has no bias


def test_later_layers_change_earlier_ones_do_not(llama):
    with torch.no_grad():
        clean = llama.model(input_ids=_ids(llama), output_hidden_states=True).hidden_states
        with ablate_heads(llama, [(1, 0)]):
            ablated = llama.model(input_ids=_ids(llama), output_hidden_states=True).hidden_states
    torch.testing.assert_close(ablated[1], clean[1])  # after layer 0: unchanged
    assert not torch.allclose(ablated[2], clean[2])  # after layer 1: changed


def test_bad_heads_and_models_say_what_is_wrong(llama):
    with pytest.raises(ValueError, match="out of range"):
        with ablate_heads(llama, [(5, 0)]):
            pass
    with pytest.raises(ValueError, match="does not predict the next word"):
        option_logprobs(tiny_model("bert"), ["a"], [[" b", " c"]])


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


def _silence_heads_except(lm, keep: set[tuple[int, int]]):
    """Zero the output-projection columns of every head not in `keep`: ablating one of them changes nothing."""
    hd = lm.config.head_dim
    with torch.no_grad():
        for layer, proj in output_projections(lm).items():
            for h in range(lm.config.num_attention_heads):
                if (layer, h) not in keep:
                    proj.weight[:, h * hd : (h + 1) * hd] = 0


def test_causal_check_against_heads_that_cannot_matter():
    # Only L1H3 writes to the residual stream; every random set ablates heads whose output is
    # multiplied by zero columns, so each random delta is exactly 0. With ties counted as "at least
    # as large a drop", p = 1/(1+n) when ablating L1H3 lowers the preference, and 1 otherwise.
    lm = tiny_model("llama", seed=3)
    _silence_heads_except(lm, {(1, 3)})
    n_random = 4
    check = causal_check(lm, PROMPTS, OPTIONS, ANSWERS, [(1, 3)], n_random=n_random, seed=1)
    before = _preference_by_hand(option_logprobs(lm, PROMPTS, OPTIONS))
    with ablate_heads(lm, [(1, 3)]):
        after = _preference_by_hand(option_logprobs(lm, PROMPTS, OPTIONS))
    expected_delta = sum(a - b for a, b in zip(after, before)) / 2
    assert check.n == 2 and check.heads == ((1, 3),) and check.random_deltas == (0.0,) * n_random
    assert check.preference_before == pytest.approx(sum(before) / 2)
    assert check.delta == pytest.approx(expected_delta) and abs(check.delta) > 1e-4
    assert check.p_value == (1 / (1 + n_random) if check.delta < 0 else 1.0)
    assert check.verdict.startswith("ablating L1H3 moves the preference")
    assert check.to_dict()["heads"] == [{"layer": 1, "head": 3}]


def test_causal_check_when_no_head_can_matter():
    # Every head's output columns are zero: no ablation changes anything, all deltas tie at 0 and
    # the p-value (1 + #ties) / (1 + n) is exactly 1.
    lm = tiny_model("llama", seed=3)
    _silence_heads_except(lm, set())
    check = causal_check(lm, PROMPTS, OPTIONS, ANSWERS, [(0, 1), (1, 2)], n_random=3, seed=0)
    assert check.delta == 0.0 and check.random_deltas == (0.0, 0.0, 0.0) and check.p_value == 1.0
    assert check.preference_after == check.preference_before
    assert check.verdict.endswith("not a larger drop than random heads give (p = 1).")
