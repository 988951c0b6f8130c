"""Encoder–decoder models in the report: encoder self, decoder self and cross attention in the explorer
and the figures, with the target's units as rows and the source's as columns where they differ."""

from __future__ import annotations

import functools
import json
import re
from dataclasses import replace

import pytest
from click.testing import CliRunner

from headscope import RunSettings, analyse_model, builtin_set
from headscope.cli import cli
from headscope.probe.extract import extract
from headscope.probe.tiny import tiny_model
from headscope.reports.analysis import ModelAnalysis
from headscope.reports.html import build_report, explorer_data

SOURCES = ("The cat sat on the mat.", "A dog ran.")
TARGETS = ("Le chat dort.", "Un chien court vite.")


@functools.lru_cache(maxsize=None)
def _section(family: str) -> ModelAnalysis:
    lm = tiny_model(family)
    maps = tuple(extract(lm, list(SOURCES)))
    pairs = tuple(extract(lm, list(SOURCES), target=list(TARGETS)))
    analysis = ModelAnalysis(model=f"tiny-{family}", maps=maps, pairs=pairs)
    assert analysis.word_pairs and all(w.level == "word" for w in analysis.word_pairs)  # derived, both sides know words
    return analysis


@functools.lru_cache(maxsize=None)
def _report(family: str):
    """The report of `_section(family)`, drawn once for the figure and the browser tests."""
    return build_report([_section(family)])


@pytest.mark.parametrize("family", ["t5", "bart"])
def test_explorer_data_has_all_three_kinds_with_their_own_labels(family):
    section = _section(family)
    [model] = explorer_data([section])["models"]
    assert set(model["kinds"]) >= {"encoder", "decoder", "cross"}
    for i, sentence in enumerate(model["sentences"]):
        pair = section.pairs[i]
        assert list(sentence["views"]) == ["encoder", "decoder", "cross"]
        assert sentence["text"] == f"{SOURCES[i]} → {TARGETS[i]}"
        for kind, amap in (("encoder", section.maps[i]), ("decoder", pair.decoder), ("cross", pair.cross)):
            units = sentence["views"][kind]["attention"]["token"]
            rows = units.get("queries", units["labels"])
            queries, keys = (pair.decoder, pair.encoder) if kind == "cross" else (amap, amap)
            assert rows == list(queries.labels) and units["labels"] == list(keys.labels)
            n_l, n_h = amap.attention.shape[:2]
            assert len(units["att"]) == n_l * n_h and {len(r) for r in units["att"]} == {len(rows) * len(keys)}
            # one head's row sums to 1000 (three decimals), up to rounding of each of its cells
            row0 = units["att"][n_h + 1][: len(keys)]
            assert abs(sum(row0) - 1000) <= len(keys)
        cross = sentence["views"]["cross"]["attention"]["token"]
        assert cross["labels"] != cross["queries"] and cross["causal"] is False
        assert sentence["views"]["decoder"]["attention"]["token"]["causal"] is True
        assert "word" in sentence["views"]["cross"]["attention"]


def test_one_stack_sections_keep_a_single_self_view():
    lm = tiny_model("bert")
    data = explorer_data([ModelAnalysis(model="b", maps=tuple(extract(lm, list(SOURCES))))])
    [model] = data["models"]
    assert [list(s["views"]) for s in model["sentences"]] == [["self"], ["self"]]
    assert model["note"] == ""
    assert "queries" not in model["sentences"][0]["views"]["self"]["attention"]["token"]


def test_figures_show_decoder_and_cross_attention_and_say_which():
    report = _report("t5")
    captions = [f.caption for f in report.figures if f.group == "attention"]
    assert sum(c.startswith("Cross-attention (target → source)") for c in captions) == len(SOURCES)
    assert sum(c.startswith("Decoder self-attention") for c in captions) == len(SOURCES)
    assert sum(c.startswith("Encoder self-attention") for c in captions) == len(SOURCES)
    assert any(f"target “{TARGETS[0]}”, source “{SOURCES[0]}”" in c for c in captions)


def test_mismatched_pairs_are_refused():
    section = _section("t5")
    with pytest.raises(ValueError, match="1 pairs for 2 sentences"):
        ModelAnalysis(model="m", maps=section.maps, pairs=section.pairs[:1])


def test_analyse_model_pairs_the_report_sentences_with_their_targets(draw_only):
    draw_only()  # the page's tables and data; the figures of pairs are test_figures_show_decoder_...
    lm = tiny_model("t5")
    sets = [("t", builtin_set("agreement")[:16])]
    given = RunSettings(corpus="c", coref="p", texts=SOURCES, targets=TARGETS, permutations=100, induction_sequences=0)
    a = analyse_model(lm, ["A dog ran."] * 2, sets, given)
    assert [p.decoder.text for p in a.pairs] == list(TARGETS) and a.info["targets"] == "given"
    assert [p.encoder.text for p in a.pairs] == [m.text for m in a.maps] == list(SOURCES)
    # The encoder's norm-based weights for the explorer's toggle, kept at word level in the report.
    assert [m.weight for m in a.norm_maps] == ["norm", "norm"]
    assert {m.level for m in a.shown_norm_maps} == {"word"}
    html = build_report([a]).html
    # The verification rows say which attention they check, first.
    assert re.search(r"<thead><tr><th>kind</th><th>layer</th>", html)
    assert "Targets: given." in json.dumps(explorer_data([a]), ensure_ascii=False)
    # Head ablation reads one stack's output: not run by default, and asked for, it says why in the notes.
    assert a.evidence is None and not any("ablation" in n for n in a.notes)
    asked = analyse_model(lm, ["A dog ran."], sets, replace(given, ablation=True, texts=SOURCES[:1], targets=TARGETS[:1]))
    assert asked.evidence is None and any("ablation evidence was not run" in n for n in asked.notes)


def test_without_targets_each_sentence_is_its_own_target():
    from headscope.workflows.run import DEFAULT_TARGETS, _report_attention

    settings = RunSettings(corpus="c", coref="p", texts=SOURCES)
    maps, pairs, norm_maps = _report_attention(tiny_model("bart"), settings)
    assert [p.decoder.text for p in pairs] == list(SOURCES) and "itself" in DEFAULT_TARGETS
    assert [m.text for m in norm_maps] == list(SOURCES)  # the encoder's norm weights, for the toggle
    assert _report_attention(tiny_model("bert"), settings)[1] == []  # one-stack models: no pairs
    with pytest.raises(ValueError, match="1 targets for 2 report sentences"):
        _report_attention(tiny_model("t5"), RunSettings(corpus="c", coref="p", texts=SOURCES, targets=TARGETS[:1]))


@pytest.mark.parametrize("args, message", [
    (["--text", "a b", "--target", "x", "--target", "y"], "2 targets for 1 sentences"),
    (["--target", "x"], "1 targets for 3 sentences"),
    (["--text", "a b", "--target", " "], "--target 1 is empty"),
])
def test_cli_refuses_targets_that_do_not_pair(tmp_path, args, message):
    result = CliRunner().invoke(cli, ["run", "--model", "tiny:t5", "--report", str(tmp_path / "r"), *args])
    assert result.exit_code == 2 and message in result.output and len(result.output.strip().splitlines()) == 1


@pytest.mark.browser
def test_selecting_cross_attention_draws_target_rows_and_source_columns(browser, tmp_path):
    section = _section("t5")
    _report("t5").write(tmp_path)
    page = browser.new_page()
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto((tmp_path / "index.html").as_uri())
    page.wait_for_selector("#hs-explorer[data-ready='1']")
    page.check("input[name='hs-level'][value='token']")
    assert page.is_visible("#hs-kind")
    page.select_option("#hs-kind", "cross")
    pair = section.pairs[0]
    nq, nk = len(pair.decoder), len(pair.encoder)
    assert page.locator("#hs-heatmap").get_attribute("data-kind") == "cross"
    assert page.locator("#hs-heatmap rect.hs-cell").count() == nq * nk
    assert page.locator("#hs-heatmap rect.hs-cell[fill='#eeeeee']").count() == 0  # cross attention is not masked
    rows = page.eval_on_selector_all("#hs-heatmap text.hs-label[data-q]", "els => els.map(e => e.textContent)")
    cols = page.eval_on_selector_all("#hs-heatmap text.hs-key[data-k]", "els => els.map(e => e.textContent)")
    assert len(rows) == nq and len(cols) == nk
    assert rows == list(pair.decoder.labels) and cols == list(pair.encoder.labels)
    assert "target" in page.inner_text("#hs-caption")
    page.select_option("#hs-kind", "decoder")
    masked = page.locator("#hs-heatmap rect.hs-cell[fill='#eeeeee']").count()
    assert masked == nq * (nq - 1) // 2 and errors == []
    page.close()
