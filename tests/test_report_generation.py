"""Generated tokens in the report: the explorer steps through a generation (prev/next), each step one
query row over the prompt and the tokens generated so far, as `hs.show` does inline."""

from __future__ import annotations

import functools

import pytest

import headscope as hs
from headscope import RunSettings, analyse_model, builtin_set
from headscope.probe.generate import generate_attention
from headscope.probe.tiny import tiny_model
from headscope.reports.analysis import ModelAnalysis
from headscope.reports.html import build_report, explorer_data

PROMPT = "The cat sat on the"
N = 4


@functools.lru_cache(maxsize=None)
def _section(family: str) -> ModelAnalysis:
    lm = tiny_model(family)
    gen = generate_attention(lm, PROMPT, max_new_tokens=N)
    return ModelAnalysis(model=f"tiny-{family}", maps=tuple(hs.extract(lm, PROMPT)), generations=(gen,))


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_explorer_data_has_one_step_per_generated_token(family):
    section = _section(family)
    gen = section.generations[0]
    [model] = explorer_data([section])["models"]
    assert len(model["sentences"]) == 2 and "steps" not in model["sentences"][0]
    steps = model["sentences"][1]["steps"]
    assert [s["token"] for s in steps] == list(gen.generated_tokens) and len(steps) == len(gen)
    n_prompt = len(gen.prompt)
    for t, step in enumerate(steps):
        units = step["views"]["self"]["attention"]["token"]
        n_k = n_prompt + t + 1  # the prompt and the tokens generated up to this one
        assert units["labels"] == list(gen.prompt.labels) + list(gen.generated_tokens[: t + 1])
        assert units["queries"] == [gen.generated_tokens[t]] and units["offset"] == n_k - 1
        assert len(units["att"]) == gen.prompt.n_layers * gen.prompt.n_heads
        assert all(len(r) == n_k and abs(sum(r) - 1000) <= n_k for r in units["att"])
        assert units["att"][0] == [round(float(v) * 1000) for v in gen.steps[t][0, 0]]


def test_analyse_model_generates_after_each_report_sentence_for_decoders_only():
    settings = RunSettings(corpus="c", coref="p", texts=(PROMPT, "A dog"), permutations=100, induction_sequences=0,
                           generate=2)
    sets = [("t", builtin_set("agreement")[:16])]
    a = analyse_model(tiny_model("llama"), ["A dog ran."] * 2, sets, settings)
    assert [g.prompt.text for g in a.generations] == [PROMPT, "A dog"] and {len(g) for g in a.generations} <= {1, 2}
    assert a.to_dict()["generated"][0]["prompt"] == PROMPT and "generate" in a.seconds
    b = analyse_model(tiny_model("bert"), ["A dog ran."] * 2, sets, settings)
    assert b.generations == () and "generated" not in b.to_dict()


@pytest.mark.browser
def test_prev_and_next_step_through_the_generated_tokens(browser, tmp_path):
    section = _section("gpt2")
    gen = section.generations[0]
    build_report([section]).write(tmp_path)
    page = browser.new_page()
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto((tmp_path / "index.html").as_uri())
    page.wait_for_selector("#hs-explorer[data-ready='1']")
    assert not page.is_visible("#hs-step-box")  # a plain sentence has no steps
    page.select_option("#hs-sentence", "1")
    page.check("input[name='hs-level'][value='token']")
    assert page.is_visible("#hs-step-box") and page.is_disabled("#hs-prev")

    def shape():
        rows = page.eval_on_selector_all("#hs-heatmap text.hs-label[data-q]", "els => els.map(e => e.textContent)")
        return rows, page.locator("#hs-heatmap rect.hs-cell").count()

    n_prompt = len(gen.prompt)
    for t in range(len(gen)):
        rows, cells = shape()
        assert cells == n_prompt + t + 1 and len(rows) == 1
        assert f"step {t + 1} of {len(gen)}" in page.inner_text("#hs-step")
        if t < len(gen) - 1:
            page.click("#hs-next")
    assert page.is_disabled("#hs-next")
    page.click("#hs-prev")
    assert shape()[1] == n_prompt + len(gen) - 1
    assert page.locator("#hs-heatmap rect.hs-cell[fill='#eeeeee']").count() == 0  # a new token sees every key
    assert errors == []
    page.close()
