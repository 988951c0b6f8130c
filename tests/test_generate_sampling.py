"""Sampling, several prompts and chat turns in generation (probe.generate, `headscope generate`)."""

import copy
import dataclasses
import json

import pytest
import torch
from click.testing import CliRunner

from conftest import _tiny
from headscope.probe.generate import _pick, chat_prompt, generate_attention

TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def _chat_model():
    """The cached tiny llama with a copy of its tokenizer that has a chat template (the cached one is untouched)."""
    lm = _tiny("llama")
    tok = copy.deepcopy(lm.tokenizer)
    tok.chat_template = TEMPLATE
    return dataclasses.replace(lm, tokenizer=tok)


def test_the_nucleus_holds_only_the_tokens_that_reach_top_p():
    logits = torch.tensor([0.6, 0.3, 0.1]).log()  # probabilities 0.6, 0.3, 0.1 at temperature 1
    g = torch.Generator().manual_seed(0)
    assert {_pick(logits, 1.0, 0.5, g) for _ in range(200)} == {0}  # 0.6 alone reaches 0.5
    drawn = [_pick(logits, 1.0, 0.8, g) for _ in range(400)]
    assert set(drawn) == {0, 1} and 0.55 < drawn.count(0) / 400 < 0.78  # renormalised: 2/3 and 1/3
    assert _pick(logits, 0.0, 1.0, g) == 0  # temperature 0: the argmax


def test_a_seed_gives_the_same_tokens_and_greedy_stays_the_default():
    lm = _tiny("llama")
    a = generate_attention(lm, "The cat sat", max_new_tokens=4, temperature=1.5, seed=7)
    b = generate_attention(lm, "The cat sat", max_new_tokens=4, temperature=1.5, seed=7)
    assert a.generated_ids == b.generated_ids and a.sampling == {"temperature": 1.5, "top_p": 1.0, "seed": 7}
    greedy = generate_attention(lm, "The cat sat", max_new_tokens=4)
    tiny_nucleus = generate_attention(lm, "The cat sat", max_new_tokens=4, temperature=1.0, top_p=1e-9, seed=1)
    assert tiny_nucleus.generated_ids == greedy.generated_ids and greedy.sampling == {"temperature": 0.0}
    for bad in ({"temperature": -1}, {"top_p": 0}, {"top_p": 1.5}, {"seed": "x"}):
        with pytest.raises(ValueError):
            generate_attention(lm, "The cat", max_new_tokens=1, **bad)


def test_chat_tokens_are_labelled_by_their_turn():
    lm = _chat_model()
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
    text, turns = chat_prompt(lm, messages)
    assert text == "<|system|>Be brief.\n<|user|>Hi there\n<|assistant|>"
    assert turns == ((0, 20, "system"), (20, 37, "user"), (37, 50, "assistant"))
    g = generate_attention(lm, text, max_new_tokens=2, turns=turns)
    from headscope.probe.encoding import encode

    enc = encode(lm, text)
    expected = []  # by hand: the role of the range a token's span starts in
    for a, b in enc.spans:
        expected.append(None if a == b else "system" if a < 20 else "user" if a < 37 else "assistant")
    expected = [e or next(x for x in expected[i:] + ["assistant"] if x) for i, e in enumerate(expected)]
    assert list(g.prompt_turns) == expected and set(expected) == {"system", "user", "assistant"}
    assert g.turns(1)[-2:] == ("assistant", "assistant") and len(g.turns(1)) == len(g.key_labels(1))
    assert g.to_dict()["prompt_turns"] == expected
    assert not getattr(_tiny("llama").tokenizer, "chat_template", None)  # the cached model is untouched


def test_a_default_system_turn_put_in_by_the_template_is_labelled_system():
    lm = _chat_model()
    lm.tokenizer.chat_template = "{% if messages[0]['role'] != 'system' %}<|system|>Default.\n{% endif %}" + TEMPLATE
    text, turns = chat_prompt(lm, [{"role": "user", "content": "Hi"}])
    assert text == "<|system|>Default.\n<|user|>Hi\n<|assistant|>"
    assert turns == ((0, 19, "system"), (19, 30, "user"), (30, 43, "assistant"))


def test_chat_without_a_template_and_bad_messages_are_refused():
    with pytest.raises(ValueError, match="no chat template"):
        chat_prompt(_tiny("llama"), [{"role": "user", "content": "x"}])
    with pytest.raises(ValueError, match="messages must be"):
        chat_prompt(_chat_model(), [{"role": "robot", "content": "x"}])


def test_cli_several_sampled_prompts_and_its_refusals():
    from headscope.cli import cli

    r = CliRunner().invoke(cli, ["generate", "--model", "tiny:llama", "--prompt", "The cat", "--prompt", "A dog",
                                 "--max-new-tokens", "2", "--temperature", "0.7", "--seed", "3", "--json", "--quiet"])
    assert r.exit_code == 0, r.output
    gens = json.loads(r.output)["generations"]
    assert [g["prompt"] for g in gens] == ["The cat", "A dog"] and gens[0]["sampling"]["seed"] == 3
    r = CliRunner().invoke(cli, ["generate", "--model", "tiny:llama", "--prompt", "x", "--system", "s"])
    assert r.exit_code == 2 and "--chat" in r.output
    r = CliRunner().invoke(cli, ["generate", "--model", "tiny:llama", "--prompt", "x", "--top-p", "0"])
    assert r.exit_code == 2


def test_the_explorer_generates_a_chat_with_turns():
    from headscope.workflows.explore import Explorer

    g = Explorer({"m": _chat_model()}).generate("m", "Hi there", layer=0, head=0, max_new_tokens=2, chat=True)
    assert g["turns"][-1] == "assistant" and "user" in g["turns"] and len(g["turns"]) == len(g["prompt_labels"])
