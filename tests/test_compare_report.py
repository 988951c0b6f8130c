"""`headscope compare A B --report DIR`: the report's Comparison section, its difference grids and tables."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from click.testing import CliRunner

from headscope.probe.tiny import tiny_model

from test_compare import TINY_CORPUS, _perturbed


@pytest.fixture
def two_checkpoints(monkeypatch, tmp_path):
    """`a` = a tiny BERT, `b` = the same with its last layer's query weights perturbed."""
    import headscope.commands.compare as compare_cmd

    lm = tiny_model("bert")
    last = lm.config.num_hidden_layers - 1
    models = {"a": lm, "b": _perturbed(lm, f"encoder.layer.{last}.attention.self.query.weight", 100)}
    monkeypatch.setattr(compare_cmd, "load_or_fail", lambda name, *placement: models[name])
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(TINY_CORPUS), encoding="utf-8")
    return models, corpus, last


def _compare(corpus, out, *args):
    from headscope.cli import cli

    return CliRunner().invoke(cli, ["compare", "a", "b", "--corpus", str(corpus), "--report", str(out), *args])


def test_compare_report_shows_only_the_perturbed_layer_changed(two_checkpoints, tmp_path):
    models, corpus, last = two_checkpoints
    out = tmp_path / "report"
    res = _compare(corpus, out, "--json")
    assert res.exit_code == 0, res.output
    heads = pd.read_csv(out / "comparison_heads.csv")
    assert set(heads["model"]) == {"tiny-bert-perturbed"} and set(heads["compared_with"]) == {"tiny-bert"}
    # the earlier layers compute exactly what they did: every difference there is 0 and nothing changed
    assert (heads[heads["layer"] < last]["diff"] == 0).all() and not heads[heads["layer"] < last]["changed"].any()
    changed = heads[heads["changed"]]
    assert len(changed) and set(changed["layer"]) == {last}
    assert (changed["ci_low"] <= changed["diff"]).all() and (changed["diff"] <= changed["ci_high"]).all()
    metrics = list(dict.fromkeys(heads["metric"]))
    record = json.loads((out / "run.json").read_text())
    figures = record["files"]["figures"]
    assert [f for f in figures if "-compare-" in f] == [f"figures/tiny-bert-perturbed-compare-{m}.png" for m in metrics]
    # both models' verification is in the report too
    assert {"figures/tiny-bert-verification.png", "figures/tiny-bert-perturbed-verification.png"} <= set(figures)
    assert all((out / f).is_file() for f in record["files"]["figures"])
    assert record["comparison"]["a"] == "tiny-bert" and record["verification"]["b"]["passed"] is True
    html = (out / "index.html").read_text(encoding="utf-8")
    assert '<section id="comparison">' in html and '<a href="#comparison">Comparison</a>' in html
    named = sorted({f"L{r.layer}H{r.head}" for r in changed.itertuples()})
    assert f"<b>Changed heads:</b> {', '.join(named)} ({len(changed)} of {len(heads)}" in html
    assert json.loads(res.stdout)["n_texts"] == len(TINY_CORPUS)  # --json prints what it always did


def test_compare_report_folder_is_checked_before_any_work(two_checkpoints, tmp_path):
    _, corpus, _ = two_checkpoints
    out = tmp_path / "report"
    out.mkdir()
    (out / "mine.txt").write_text("x")
    res = _compare(corpus, out, "--no-verify")
    assert res.exit_code == 2 and f"--report {out} already exists" in res.output
    assert len(res.output.strip().splitlines()) == 1
    res = _compare(corpus, out, "--no-verify", "--force")
    assert res.exit_code == 2 and "no run.json, so headscope did not write it" in res.output
    assert (out / "mine.txt").read_text() == "x" and not (out / "index.html").exists()
