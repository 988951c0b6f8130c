"""The report's Syntax section: figures from the registry, tables beside the report, `run --conllu`."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch
from click.testing import CliRunner

from headscope.analyses.syntax.result import score_syntax
from headscope.analyses.syntax.trees import choose_tree_head
from headscope.reports.panels import FIGURES
from headscope.reports.analysis import ModelAnalysis
from headscope.reports.html import build_report

from test_syntax import _records, _sentences_file, _split

SYNTAX_FIGURES = [name for name, spec in FIGURES.items() if spec.group.startswith("syntax")]


def _result():
    """Head L0H0 points every word at its governor, L0H1 at the previous word (see test_syntax._records)."""
    select, test = _records(_split(20)), _records(_split(20))
    choice = choose_tree_head(select, torch.tensor([0.0, 1.0]))
    return score_syntax(select, test, model="toy", treebank="t.conllu", selection="hand-built", layer_ids=[0],
                        head_ids=[0, 1], tree_selection=choice, n_perm=200)


def _clusters():
    return pd.DataFrame({"model": ["toy", "toy"], "layer": [0, 0], "head": [0, 1], "name": ["L0H0", "L0H1"],
                         "x": [0.0, 1.0], "y": [0.0, 0.0], "role": ["", "previous token"]})


@pytest.fixture(scope="module")
def report():
    result = _result()
    return result, build_report([ModelAnalysis(model="toy", syntax=result, syntax_clusters=_clusters())])


def test_syntax_figures_are_registry_entries_drawn_by_name(report):
    result, rep = report
    names = [f.name for f in rep.figures]
    crowned = [(r.relation, r.direction) for r in result.relations if r.best_head is not None]
    directions = dict.fromkeys(d for _, d in crowned)
    assert {"syntax_relations", "syntax_tree", "syntax_clusters", "syntax_grid"} <= set(FIGURES)
    assert [n for n in names if "-syntax-grid-" in n] == [
        f"toy-syntax-grid-{r.replace(':', '-')}-{d.replace('->', '-to-')}.png" for r, d in crowned]
    assert [n for n in names if "-syntax-grid-" not in n] == (
        [f"toy-syntax-{d.replace('->', '-to-')}.png" for d in directions] + ["toy-syntax-tree.png", "toy-syntax-clusters.png"])


def test_syntax_tables_hold_the_known_answers(report, tmp_path):
    result, rep = report
    rel = rep.tables["syntax_relations"].set_index(["relation", "direction"])
    det = rel.loc[("det", "dependent->head")]
    # L0H0 finds every determiner's noun; the best offset (+1) is right on SHORT only: 20 of 40
    assert det.best_head == "L0H0" and det.n == 40 and det.heldout_accuracy == 1.0
    assert det.baseline_offset == 1 and det.baseline_accuracy == 0.5 and bool(det.beats_baseline)
    amod = rel.loc[("amod", "dependent->head")]  # 'big' -> 'cat' is offset +1 every time: no head beats it
    assert amod.baseline_accuracy == 1.0 and not amod.beats_baseline and "no head beats" in amod.verdict
    trees = rep.tables["syntax_trees"].iloc[0]
    assert trees.best_head == "L0H0" and trees.uuas == 1.0 and trees.right_branching_uuas == pytest.approx(60 / 70)
    assert len(rep.tables["syntax_heads"]) == 2 * len(result.relations)
    assert rep.tables["syntax_clusters"]["role"].tolist() == ["", "previous token"]
    rep.write(tmp_path)
    back = pd.read_csv(tmp_path / "syntax_relations.csv")
    assert back.columns[:4].tolist() == ["model", "relation", "direction", "n"] and len(back) == len(result.relations)


def test_syntax_section_in_the_page(report):
    result, rep = report
    html = rep.html
    assert '<section id="syntax">' in html and '<a href="#syntax">Syntax</a>' in html
    assert html.count('<tr><td>det</td>') == 2  # both directions
    assert "no head beats the offset baseline" in html
    assert html.count("<td>L0H0</td>") >= 2 and "decodes trees with UUAS 100.0%" in html
    assert "layer × head grids, one per relation and direction" in html


def test_a_report_without_syntax_has_no_syntax_section():
    from report_samples import section

    rep = build_report([ModelAnalysis(model="toy", corpus=section().corpus)])
    assert 'id="syntax"' not in rep.html and "#syntax" not in rep.html
    assert not [t for t in rep.tables if t.startswith("syntax")] and not rep.figures


# ---------------------------------------------------------------- headscope run --conllu


@pytest.fixture
def tiny_bert(monkeypatch):
    from headscope.commands import run as run_mod
    from headscope.probe.tiny import tiny_model

    lm = tiny_model("bert")
    monkeypatch.setattr(run_mod, "load_or_fail", lambda name, *placement: lm)
    monkeypatch.setattr(run_mod, "models_or_fail", lambda *a, **kw: None)  # test model names are not real ones
    return lm


FAST = ["--limit", "4", "--permutations", "100", "--induction-seqs", "0", "--quiet", "--text", "The cat sat."]


def test_run_with_conllu_adds_the_syntax_section(tiny_bert, tmp_path, draw_only):
    from headscope.cli import cli

    draw_only("syntax_clusters")  # the figure asserted; the module's `report` draws every syntax figure

    test, dev = _sentences_file(tmp_path, "test.conllu", 12), _sentences_file(tmp_path, "dev.conllu", 11)
    out = tmp_path / "report"
    res = CliRunner().invoke(cli, ["run", "--model", "bert", "--report", str(out), *FAST, "--conllu", str(test),
                                   "--select-on", str(dev)], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    record = json.loads((out / "run.json").read_text())
    assert record["settings"]["conllu"] == str(test) and record["settings"]["select_on"] == str(dev)
    syntax = record["models"][0]["syntax"]
    # 12 SHORT + 12 LONG test sentences, one determiner each; the 200-word sentence is too long for 128 tokens
    assert syntax["n_sentences"] == 24 and syntax["n_skipped"] == 1
    det = next(r for r in syntax["relations"] if (r["relation"], r["direction"]) == ("det", "dependent->head"))
    assert det["n"] == 24
    n_heads = tiny_bert.config.num_hidden_layers * tiny_bert.config.num_attention_heads
    assert len(pd.read_csv(out / "syntax_clusters.csv")) == n_heads
    assert len(pd.read_csv(out / "syntax_relations.csv")) == len(syntax["relations"])
    assert {"syntax", "syntax_clusters"} <= set(record["models"][0]["seconds"])
    html = (out / "index.html").read_text(encoding="utf-8")
    assert '<section id="syntax">' in html and "figures/tiny-bert-syntax-clusters.png" in html
    assert "figures/tiny-bert-syntax-clusters.png" in record["files"]["figures"]


def test_run_without_conllu_records_no_syntax(tiny_bert, tmp_path, draw_only):
    from headscope.cli import cli

    draw_only(*SYNTAX_FIGURES)  # a syntax figure drawn would be caught

    out = tmp_path / "report"
    res = CliRunner().invoke(cli, ["run", "--model", "bert", "--report", str(out), *FAST], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    record = json.loads((out / "run.json").read_text())
    assert not {"conllu", "select_on"} & set(record["settings"]) and "syntax" not in record["models"][0]
    assert not list(out.glob("syntax*")) and 'id="syntax"' not in (out / "index.html").read_text(encoding="utf-8")


@pytest.mark.parametrize("args, message", [
    (["--select-on", "dev.conllu"], "--select-on needs --conllu"),
    (["--conllu", "nope.conllu"], "--conllu nope.conllu: no such file"),
])
def test_bad_syntax_options_are_one_line_before_any_model(tiny_bert, tmp_path, args, message, monkeypatch):
    from headscope.cli import cli

    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(cli, ["run", "--model", "bert", "--report", "report", *FAST, *args])
    assert res.exit_code != 0 and message in res.output and len(res.output.strip().splitlines()) == 1


# ---------------------------------------------------------------- headscope syntax --clusters


@pytest.fixture
def tiny_syntax_models(monkeypatch):
    """`--model bert` / `bert-copy` (the same weights under another name) / `gpt2`: tiny random models."""
    import dataclasses

    import headscope.commands.syntax as syntax_cmd
    from headscope.probe.tiny import tiny_model

    bert = tiny_model("bert")
    models = {"bert": bert, "bert-copy": dataclasses.replace(bert, name="bert-copy"), "gpt2": tiny_model("gpt2")}
    monkeypatch.setattr(syntax_cmd, "load_or_fail", lambda name, *placement: models[name])
    monkeypatch.setattr(syntax_cmd, "models_or_fail", lambda *a, **kw: None)  # test model names are not real ones
    return models


def _syntax(tmp_path, *args):
    from headscope.cli import cli

    test = _sentences_file(tmp_path, "test.conllu", 3)
    return CliRunner().invoke(cli, ["syntax", "--model", "bert", "--conllu", str(test), "--permutations", "100",
                                    "--no-trees", "--quiet", "--no-verify", "--cluster-sentences", "4", *args])


def test_clusters_of_two_models_with_the_same_units(tiny_syntax_models, tmp_path):
    out = tmp_path / "clusters.csv"
    res = _syntax(tmp_path, "--clusters", str(out), "--cluster-with", "bert-copy")
    assert res.exit_code == 0, res.output
    table = pd.read_csv(out, keep_default_na=False)
    bert = tiny_syntax_models["bert"]
    n = bert.config.num_hidden_layers * bert.config.num_attention_heads
    assert table["model"].tolist() == ["tiny-bert"] * n + ["bert-copy"] * n
    # the same weights attend the same way: each head sits on its copy (distance 0), far closer than the spread
    a, b = (table[table["model"] == m][["x", "y"]].to_numpy() for m in ("tiny-bert", "bert-copy"))
    spread = np.ptp(np.vstack([a, b]), axis=0).max()
    assert np.linalg.norm(a - b, axis=1).max() < 0.05 * spread
    from headscope.analyses.heads import ROLE_LABELS

    assert set(table["role"]) <= {"", *ROLE_LABELS.values()}


def test_clusters_figure_and_refusals(tiny_syntax_models, tmp_path):
    png = tmp_path / "clusters.png"
    res = _syntax(tmp_path, "--clusters", str(png))
    assert res.exit_code == 0, res.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for args, message in ((["--clusters", str(tmp_path / "c.txt")], "give a file ending in .csv"),
                          (["--cluster-with", "gpt2"], "--cluster-with needs --clusters"),
                          (["--clusters", str(tmp_path / "c.csv"), "--cluster-with", "gpt2"],
                           "tiny-bert and tiny-gpt2 cannot be placed together")):
        res = _syntax(tmp_path, *args)
        assert res.exit_code == 2 and message in res.output, res.output
        assert len(res.output.strip().splitlines()) == 1
    assert not (tmp_path / "c.csv").exists()


def test_clusters_never_replace_a_file_without_force(tiny_syntax_models, tmp_path):
    for name in ("mine.png", "mine.csv"):
        own = tmp_path / name
        own.write_bytes(b"the user's own file")
        res = _syntax(tmp_path, "--clusters", str(own))
        assert res.exit_code == 2 and "already exists; pass --force" in res.output, res.output
        assert own.read_bytes() == b"the user's own file"  # refused before any compute, untouched
        res = _syntax(tmp_path, "--clusters", str(own), "--force")
        assert res.exit_code == 0, res.output
        assert own.read_bytes() != b"the user's own file"
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # no partial file left
