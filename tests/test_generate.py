"""Attention during generation: each cached step equals the last row of a full forward pass."""

import json

import pytest
import torch

from headscope.probe.generate import generate_attention
from headscope.probe.extract import extract
from headscope.probe.forward import base_model
from headscope.probe.tiny import tiny_model

PROMPT = "The cat sat on the mat, and the dog"


@pytest.mark.parametrize("family", ["gpt2", "llama", "gemma3"])
def test_each_step_is_the_last_row_of_a_full_forward(family):
    lm = tiny_model(family)
    g = generate_attention(lm, PROMPT, max_new_tokens=6)
    prompt_ids = list(g.prompt.token_ids)
    assert len(g) == len(g.steps) and 1 <= len(g) <= 6
    for t, row in enumerate(g.steps):
        ids = torch.tensor([prompt_ids + list(g.generated_ids[: t + 1])])
        with torch.no_grad():  # no cache: the whole sequence at once
            full = base_model(lm)(input_ids=ids, output_attentions=True, use_cache=False).attentions
        want = torch.stack([a[0, :, -1] for a in full])  # [layer, head, key]
        assert row.shape == want.shape == (lm.config.num_hidden_layers, lm.config.num_attention_heads, ids.shape[1])
        torch.testing.assert_close(row, want, atol=1e-5, rtol=0)
        assert len(g.key_labels(t)) == ids.shape[1]
    with torch.no_grad():  # greedy: each generated id is the argmax after the sequence before it
        logits = lm.model(input_ids=torch.tensor([prompt_ids + list(g.generated_ids)])).logits[0]
    greedy = logits[len(prompt_ids) - 1 : -1].argmax(-1).tolist()
    assert greedy == list(g.generated_ids)


def test_prompt_attention_is_extracts():
    lm = tiny_model("llama")
    g = generate_attention(lm, PROMPT, max_new_tokens=2)
    [m] = extract(lm, PROMPT)
    assert g.prompt.labels == m.labels
    torch.testing.assert_close(g.prompt.attention, m.attention, atol=0, rtol=0)


def test_encoders_and_bad_lengths_are_refused():
    with pytest.raises(ValueError, match="is an encoder"):
        generate_attention(tiny_model("bert"), PROMPT, max_new_tokens=2)
    with pytest.raises(ValueError, match="at least 1"):
        generate_attention(tiny_model("gpt2"), PROMPT, max_new_tokens=0)
    with pytest.raises(ValueError, match="limit of 128"):
        generate_attention(tiny_model("gpt2"), PROMPT, max_new_tokens=200)


def test_cli(monkeypatch):
    from click.testing import CliRunner

    import headscope.commands.generate as gen_cmd
    from headscope.cli import cli

    models = {"tiny-gpt2": tiny_model("gpt2"), "tiny-bert": tiny_model("bert")}
    monkeypatch.setattr(gen_cmd, "load_or_fail", lambda name, *placement: models[name])
    res = CliRunner().invoke(cli, ["generate", "--model", "tiny-gpt2", "--prompt", PROMPT, "--max-new-tokens", "3",
                                   "--json"])
    assert res.exit_code == 0, res.output
    obj = json.loads(res.stdout)
    assert len(obj["steps"]) == len(obj["generated_ids"]) and obj["steps"][0]["step"] == 0
    n_prompt = len(obj["prompt_tokens"])
    assert [len(s["attention"][0][0]) for s in obj["steps"]] == [n_prompt + t + 1 for t in range(len(obj["steps"]))]
    text = CliRunner().invoke(cli, ["generate", "--model", "tiny-gpt2", "--prompt", PROMPT, "--max-new-tokens", "2"])
    assert text.exit_code == 0 and "step" in text.output
    bad = CliRunner().invoke(cli, ["generate", "--model", "tiny-bert", "--prompt", PROMPT])
    assert bad.exit_code == 2
    assert bad.output.strip().count("\n") == 0 and "is an encoder" in bad.output  # one clear line


@pytest.mark.slow
@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
def test_real_decoders_generate_with_cached_rows_equal_to_full_forward(name, request):
    lm = request.getfixturevalue(name)
    g = generate_attention(lm, "The capital of France is", max_new_tokens=4)
    ids = torch.tensor([list(g.prompt.token_ids) + list(g.generated_ids)])
    with torch.no_grad():
        full = base_model(lm)(input_ids=ids, output_attentions=True, use_cache=False).attentions
    want = torch.stack([a[0, :, -1] for a in full])  # the last generated token's row, [layer, head, key]
    torch.testing.assert_close(g.steps[-1], want, atol=1e-4, rtol=0)


def test_the_explorer_reads_a_hybrid_stacks_layers_by_the_models_own_numbers():
    from conftest import _tiny

    from headscope.workflows.explore import Explorer, ExplorerError

    lm = _tiny("qwen3_next")  # softmax attention at 0, 1 and 3; a gated delta-net at 2
    explorer = Explorer({"m": lm}, attention="eager")
    g = explorer.generate("m", "The cat", layer=3, head=1, max_new_tokens=2)
    steps = generate_attention(lm, "The cat", max_new_tokens=2).steps  # [attention layer, head, key] per step
    assert g["rows"] == [row[2, 1].tolist() for row in steps]  # L3 is the third attention layer's row
    with pytest.raises(ExplorerError, match="layer 2 of tiny-qwen3_next has no softmax attention"):
        explorer.generate("m", "The cat", layer=2, head=1, max_new_tokens=2)  # never another layer's row
