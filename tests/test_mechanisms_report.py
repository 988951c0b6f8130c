"""The report's Mechanisms section (`run --mechanisms`): shown only when asked for, its figures from FIGURES,
its CSV tables, the encoder's one line, and the flag recorded only when given."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

from headscope.reports.analysis import ModelAnalysis
from headscope.reports.panels import FIGURES
from headscope.reports.html import build_report
from headscope.workflows.mechanisms import mechanisms

from conftest import _tiny

MECHANISM_FIGURES = {"mechanisms_dla", "mechanisms_composition", "mechanisms_patching"}


@pytest.fixture(scope="module")
def found():
    lm = _tiny("llama")
    before = {k: v.clone() for k, v in lm.model.state_dict().items()}
    m = mechanisms(lm, ["The cat sat on the", "A dog ran"], n_pairs=4)
    after = lm.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # hooks only: the model is what it was
    return m


def test_mechanisms_result_parts_and_their_identities(found):
    assert len(found.dla) == 2 and found.composition is not None and found.patching is not None and not found.notes
    for r in found.dla:  # the answer is the model's own top token, and the parts sum back to its logit
        assert r.identity_abs_err < 1e-5
    frame = found.to_frame()
    assert set(frame["measure"]) == {"dla 1", "dla 2", "patching"}
    dla1 = frame[frame["measure"] == "dla 1"].set_index(["layer", "head"])["value"]
    grid = found.dla[0].grid()
    assert all(dla1[(l, h)] == pytest.approx(grid.loc[l, h]) for l in grid.index for h in grid.columns)
    assert len(found.patching.pairs) == 4 and found.patching.verdict
    assert len(found.composition_frame()) <= 3 * found.edges
    assert "composition" in found._repr_html_() and found.composition._repr_html_().startswith("<p>")
    assert json.dumps(found.to_dict())


def test_dla_of_the_top_token_is_the_models_argmax():
    lm = _tiny("gpt2")
    r = mechanisms(lm, ["The cat sat on the"], n_pairs=4).dla[0]
    ids = lm.tokenizer("The cat sat on the", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        logits = lm.model(ids).logits[0, -1]
    assert r.answer_id == int(logits.argmax()) and r.total == pytest.approx(float(logits.max()), abs=1e-4)


def test_section_figures_and_tables(found):
    assert MECHANISM_FIGURES <= set(FIGURES) and {FIGURES[n].group for n in MECHANISM_FIGURES} == {"mechanisms"}
    rep = build_report([ModelAnalysis(model="tiny-llama", mechanisms=found)])
    assert '<section id="mechanisms">' in rep.html and '<a href="#mechanisms">Mechanisms</a>' in rep.html
    assert [f.name for f in rep.figures] == ["tiny-llama-mechanisms-dla-0.png", "tiny-llama-mechanisms-dla-1.png",
                                             "tiny-llama-mechanisms-composition-k.png",
                                             "tiny-llama-mechanisms-patching.png"]
    assert found.patching.verdict.split(" (")[0][:40] in rep.html.replace("&#39;", "'")
    t = rep.tables
    assert t["mechanisms_dla"]["sentence"].nunique() == 2 and t["mechanisms_dla"].columns[0] == "model"
    assert len(t["mechanisms_patching"]) == 8 and len(t["mechanisms_composition"]) > 0
    assert ModelAnalysis(model="m", mechanisms=found).to_dict()["mechanisms"]["patching"]["pair_set"] == "ioi"


def test_an_encoder_says_in_one_line_why_there_is_no_dla():
    m = mechanisms(_tiny("bert"), ["The cat sat on the mat."])
    assert not m.dla and m.patching is None
    dla_note = [n for n in m.notes if n.startswith("direct logit attribution was not run")]
    assert len(dla_note) == 1 and "\n" not in dla_note[0] and "decoder" in dla_note[0]
    html = build_report([ModelAnalysis(model="tiny-bert", mechanisms=m)]).html
    assert '<section id="mechanisms">' in html and "direct logit attribution was not run" in html


def test_a_report_without_mechanisms_has_no_section():
    from report_samples import section

    rep = build_report([ModelAnalysis(model="toy", corpus=section().corpus)])
    assert 'id="mechanisms"' not in rep.html and "#mechanisms" not in rep.html
    assert not {n for n in rep.tables if n.startswith("mechanisms")}
    assert not any(f.name.startswith("toy-mechanisms") for f in rep.figures)
    assert "mechanisms" not in ModelAnalysis(model="toy").to_dict()


def test_settings_record_mechanisms_only_when_given():
    from dataclasses import replace

    from headscope.commands.run import shown_settings
    from headscope.workflows.run import RunSettings

    plain = RunSettings(corpus="c", coref="p", texts=("The cat sat.",))
    assert plain.mechanisms is False and not {"mechanisms", "mechanisms_pairs"} & set(shown_settings(plain))
    on = shown_settings(replace(plain, mechanisms=True))
    assert on["mechanisms"] is True and on["mechanisms_pairs"] == 8


def test_run_mechanisms_adds_the_section(tmp_path, monkeypatch, draw_only):
    from headscope.cli import cli
    from headscope.commands import run as run_mod

    draw_only(*MECHANISM_FIGURES)  # the section's own figures; test_run.py draws the rest of a run

    lm = _tiny("llama")
    monkeypatch.setattr(run_mod, "load_or_fail", lambda name, *placement: lm)
    monkeypatch.setattr(run_mod, "models_or_fail", lambda *a, **kw: None)  # "llama" is a test name
    fast = ["--limit", "4", "--permutations", "100", "--induction-seqs", "0", "--quiet", "--text", "The cat sat."]
    out = tmp_path / "report"
    res = CliRunner().invoke(cli, ["run", "--model", "llama", "--report", str(out), *fast, "--mechanisms"],
                             catch_exceptions=False)
    assert res.exit_code == 0, res.output
    record = json.loads((out / "run.json").read_text())
    assert record["settings"]["mechanisms"] is True and record["models"][0]["mechanisms"]["dla"]
    assert (out / "mechanisms_dla.csv").exists() and (out / "mechanisms_patching.csv").exists()
    assert any(p.name.endswith("mechanisms-patching.png") for p in (out / "figures").iterdir())
    assert '<section id="mechanisms">' in (out / "index.html").read_text(encoding="utf-8")
