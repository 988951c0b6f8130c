"""The report's Sinks section: shown only when asked for, its figures from FIGURES, its CSV tables, run --sinks."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from headscope.analyses.sinks import SinkRate, SinkReport, StreamingResult
from headscope.reports.analysis import ModelAnalysis
from headscope.reports.panels import FIGURES
from headscope.reports.html import build_report


def _report() -> SinkReport:
    heads = pd.DataFrame({"layer": [0, 0, 1, 1], "head": [0, 1, 0, 1], "first_share_1": [0.9, 0.1, 0.8, 0.2],
                          "first_share_4": [0.95, 0.3, 0.9, 0.4], "norm_share": [0.05, 0.1, 0.6, 0.2],
                          "value_norm_ratio": [0.01, 1.0, 0.9, 1.1], "sink": [True, False, True, False],
                          "ablation_effect": [0.0, 0.1, 0.5, 0.1], "random_median": [0.1, 0.1, 0.1, 0.1],
                          "ablation_p": [1.0, 0.5, 0.25, 0.5], "dormant": [True, None, False, None]})
    rates = (SinkRate("text", 1, 0.3, 64, 8, 0.5, (0.25, 0.75), 0.4), SinkRate("random", 1, 0.3, 64, 8, 0.25, (0.0, 0.5), 0.3))
    massive = pd.DataFrame([{"layer": 0, "sequence": 0, "position": 3, "token": "a", "dim": 1, "value": 2.0,
                             "ratio_to_median": 4.0, "massive": False},
                            {"layer": 1, "sequence": 0, "position": 0, "token": "<s>", "dim": 7, "value": -900.0,
                             "ratio_to_median": 3000.0, "massive": True}])
    return SinkReport(model="toy", heads=heads, rates=rates, massive=massive, settings={"ablation": {
        "method": "mean", "texts": 4, "n_random": 19}})


def _streaming() -> StreamingResult:
    rng = np.random.default_rng(0)
    dense = rng.uniform(2, 4, 99)
    return StreamingResult(model="toy", n_tokens=100, window=16, keep=2, dense=dense, window_only=dense + 1,
                           sink_window={1: dense + 0.1, 2: dense + 0.05})


def test_sinks_section_figures_and_tables():
    rep = build_report([ModelAnalysis(model="toy", sinks=_report(), streaming=_streaming())])
    html = rep.html
    assert '<section id="sinks">' in html and '<a href="#sinks">Sinks</a>' in html
    assert "2 of 4 heads put more than 0.3" in html and "1 of them dormant by mean ablation" in html
    assert "First in layer 1." in html and "StreamingLLM test" in html
    assert {"sink_shares", "massive_activations", "streaming"} <= set(FIGURES)
    assert [f.name for f in rep.figures] == ["toy-sinks-shares.png", "toy-sinks-massive.png", "toy-sinks-streaming.png"]
    assert len(rep.tables["sink_heads"]) == 4 and rep.tables["sink_heads"].columns[0] == "model"
    assert rep.tables["sink_rates"]["value"].tolist() == [0.5, 0.25]
    assert len(rep.tables["massive_activations"]) == 2 and len(rep.tables["streaming_nll"]) == 99
    record = ModelAnalysis(model="toy", sinks=_report(), streaming=_streaming()).to_dict()
    assert record["sinks"]["analysis"]["first_massive_layer"] == 1
    assert record["sinks"]["streaming"]["window_ppl"] == pytest.approx(np.exp(_streaming().dense.mean() + 1))


def test_a_report_without_sinks_has_no_sinks_section():
    from report_samples import section

    rep = build_report([ModelAnalysis(model="toy", corpus=section().corpus)])
    assert 'id="sinks"' not in rep.html and "#sinks" not in rep.html
    assert not {"sink_heads", "sink_rates", "massive_activations", "streaming_nll"} & set(rep.tables)
    assert "sinks" not in ModelAnalysis(model="toy").to_dict()


FAST = ["--limit", "4", "--permutations", "100", "--induction-seqs", "0", "--quiet", "--text", "The cat sat."]


@pytest.fixture
def tiny_llama(monkeypatch):
    from headscope.commands import run as run_mod
    from headscope.workflows import sinks as sinks_mod

    from conftest import _tiny

    lm = _tiny("llama")
    monkeypatch.setattr(run_mod, "load_or_fail", lambda name, *placement: lm)
    monkeypatch.setattr(run_mod, "models_or_fail", lambda *a, **kw: None)  # "llama" is a test name, not a real one
    monkeypatch.setattr(sinks_mod, "SINK_LENGTH", 16)
    return lm


def test_run_sinks_adds_the_section_and_records_its_settings(tiny_llama, tmp_path, monkeypatch, draw_only):
    from headscope.cli import cli
    from headscope.workflows import run as run_wf

    draw_only(*(n for n, spec in FIGURES.items() if spec.group == "sinks"))  # the section's own figures

    text = tmp_path / "long.txt"
    text.write_text("The cat sat on the mat. " * 20)
    monkeypatch.setattr(run_wf, "default_streaming_text", lambda: (text.read_text(), str(text)))
    real_sinks = run_wf.sinks
    monkeypatch.setattr(run_wf, "sinks", lambda lm, texts, **kw: real_sinks(
        lm, texts, length=16, n_sequences=2, n_random_sequences=2, n_boot=20, **{**kw, "ablation_texts": 2, "n_random": 3}))
    out = tmp_path / "report"
    res = CliRunner().invoke(cli, ["run", "--model", "llama", "--report", str(out), *FAST, "--sinks"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    record = json.loads((out / "run.json").read_text())
    assert record["settings"]["sinks"] is True and record["settings"]["streaming_window"] == 256
    sinks = record["models"][0]["sinks"]
    assert sinks["analysis"]["sink_rate"]["k"] == 1 and sinks["streaming"]["n_tokens"] > 100
    assert (out / "sink_heads.csv").exists() and (out / "streaming_nll.csv").exists()
    assert '<section id="sinks">' in (out / "index.html").read_text(encoding="utf-8")


def test_settings_without_sinks_record_what_they_always_did():
    from dataclasses import asdict, replace

    from headscope.commands.run import shown_settings
    from headscope.workflows.run import RunSettings

    plain = RunSettings(corpus="c", coref="p", texts=("The cat sat.",))
    assert not {"sinks", "streaming_tokens", "streaming_window"} & set(shown_settings(plain))
    with_sinks = shown_settings(replace(plain, sinks=True))
    assert with_sinks["sinks"] is True and with_sinks["streaming_tokens"] == 1024
    assert set(shown_settings(plain)) == set(asdict(plain)) - {"texts", "targets", "generate", "conllu", "select_on",
                                                               "sinks", "streaming_tokens", "streaming_window",
                                                               "mechanisms", "mechanisms_pairs", "long_context", "max_memory",
                                                               "offload_folder"}
