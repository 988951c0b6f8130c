"""`headscope run`: the whole job into one folder, atomically, with clear errors.

Most tests swap the model loader for tiny random models (milliseconds); one slow test runs the
real default model end to end.
"""

from __future__ import annotations

import functools
import json
import sys

import pytest
from click.testing import CliRunner

import headscope as hs
from headscope.cli import cli
from headscope.commands import run as run_mod

def _small_probe() -> str:
    from headscope.analyses.relations import builtin_path

    return str(builtin_path("agreement"))


# Small runs: 4 corpus texts, one probe set, one sentence, few permutations.
FAST = ["--limit", "4", "--permutations", "100", "--induction-seqs", "2", "--quiet", "--coref", _small_probe(),
        "--text", "我爱北京天安门 <b>x</b>"]


@functools.lru_cache(maxsize=None)
def _tiny(family: str):
    from headscope.probe.tiny import tiny_model

    return tiny_model(family)


@pytest.fixture
def tiny_models(monkeypatch):
    """`--model bert` / `--model llama` load the tiny random models of those families."""
    def load(name, *placement):
        if name not in ("bert", "llama"):
            run_mod.fail(f"unknown test model {name}")
        return _tiny(name)

    monkeypatch.setattr(run_mod, "load_or_fail", load)
    monkeypatch.setattr(run_mod, "models_or_fail", lambda *a, **kw: None)  # test model names are not real ones


def _invoke(*args):
    return CliRunner().invoke(cli, ["run", *args], catch_exceptions=False)


def _leftovers(folder):
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


def test_two_models_one_side_by_side_report(tiny_models, tmp_path):
    out = tmp_path / "report"
    result = _invoke("--model", "bert", "--model", "llama", "--out", str(out), *FAST)
    assert result.exit_code == 0, result.output
    assert "wrote" in result.output and "index.html" in result.output
    record = json.loads((out / "run.json").read_text())
    assert [m["model"] for m in record["models"]] == ["tiny-bert", "tiny-llama"]
    assert record["passed"] is True and record["settings"]["limit"] == 4
    assert record["seconds"]["total"] > 0
    for m in record["models"]:
        assert m["verification"]["passed"] and set(m["seconds"]) >= {"verify", "heads", "coref", "sentences"}
        assert [p["task"] for p in m["probes"]] == ["coref-agreement"]
    for f in record["files"]["figures"] + record["files"]["tables"] + ["index.html"]:
        assert (out / f).is_file(), f
    html = (out / "index.html").read_text(encoding="utf-8")
    assert html.count('<div class="model-name">tiny-bert</div>') >= 5
    assert html.count('<div class="model-name">tiny-llama</div>') >= 5
    assert "我爱北京天安门 &lt;b&gt;x&lt;/b&gt;" in html
    assert _leftovers(tmp_path) == []


def test_default_sentences_and_probe_sets(tiny_models, tmp_path, draw_only):
    draw_only()  # the defaults reach the record and the page; test_two_models_... draws every figure
    out = tmp_path / "report"
    result = _invoke("--model", "llama", "--out", str(out), "--limit", "2", "--permutations", "100",
                     "--induction-seqs", "0", "--quiet")
    assert result.exit_code == 0, result.output
    record = json.loads((out / "run.json").read_text())
    assert record["settings"]["texts"] == list(hs.REPORT_SENTENCES)
    assert [p["task"] for p in record["models"][0]["probes"]] == ["coref-builtin", "coref-agreement",
                                                                  "coref-winograd"]
    html = (out / "index.html").read_text(encoding="utf-8")
    assert "我爱北京天安门" in html and "too wide." in html


@pytest.fixture
def quick_report(tiny_models, monkeypatch):
    """The run without its analyses and drawing: for tests of where and how the folder is written."""
    import pandas as pd
    from report_samples import verification

    from headscope.reports.analysis import ModelAnalysis
    from headscope.reports.html import Report

    monkeypatch.setattr("headscope.workflows.run.analyse_model",
                        lambda lm, *args, **kw: ModelAnalysis(model=lm.name, verification=verification(lm.name)))
    monkeypatch.setattr("headscope.reports.folder.build_report", lambda analyses, **kw: Report(
        html="<p>report</p>", figures=(), tables={"t": pd.DataFrame({"a": [1]})}))


def test_existing_folder_needs_force_and_only_a_report_is_replaced_whole(quick_report, tmp_path):
    out = tmp_path / "report"
    out.mkdir()
    (out / "old.txt").write_text("keep me")
    result = CliRunner().invoke(cli, ["run", "--model", "bert", "--report", str(out), *FAST])
    assert result.exit_code == 2 and "already exists" in result.output and "--force" in result.output
    assert (out / "old.txt").read_text() == "keep me"
    result = CliRunner().invoke(cli, ["run", "--model", "bert", "--report", str(out), "--force", *FAST])
    assert result.exit_code == 2 and "headscope did not write" in result.output  # not a report: kept
    assert (out / "old.txt").read_text() == "keep me"
    (out / "old.txt").unlink()
    (out / "index.html").write_text("previous")
    (out / "run.json").write_text(json.dumps({"headscope": "0", "files": {"report": "index.html"}}))
    result = _invoke("--model", "bert", "--out", str(out), "--force", *FAST)
    assert result.exit_code == 0, result.output
    assert (out / "index.html").read_text() == "<p>report</p>"
    assert (out / "t.csv").exists() and json.loads((out / "run.json").read_text())["passed"] is True
    assert _leftovers(tmp_path) == []


def test_failed_verification_is_written_then_exits_nonzero(tiny_models, tmp_path, monkeypatch, draw_only):
    import headscope.workflows.run
    from report_samples import verification

    real = headscope.workflows.run.verify

    def broken(lm, texts=None, **kw):
        v = real(lm, texts, **kw)
        return verification(v.model, passed=False, layers=len(v.layers))

    monkeypatch.setattr(headscope.workflows.run, "verify", broken)
    draw_only("verification")  # the failed check's own figure; the others do not depend on it
    out = tmp_path / "report"
    result = CliRunner().invoke(cli, ["run", "--model", "bert", "--report", str(out), *FAST])
    assert result.exit_code == 1
    assert "NOT verified for tiny-bert" in result.output
    assert "Verification FAILED for tiny-bert" in (out / "index.html").read_text(encoding="utf-8")
    assert json.loads((out / "run.json").read_text())["passed"] is False


def test_an_interrupted_write_leaves_no_half_report(quick_report, tmp_path, monkeypatch):
    from headscope.reports.html import Report

    def half_then_interrupt(self, folder):
        (folder / "index.html").write_text("half")
        raise KeyboardInterrupt

    monkeypatch.setattr(Report, "write", half_then_interrupt)
    out = tmp_path / "report"
    result = CliRunner().invoke(cli, ["run", "--model", "bert", "--report", str(out), *FAST])
    assert result.exit_code == 130 and "interrupted" in result.output  # Ctrl-C's conventional exit status
    assert not out.exists() and _leftovers(tmp_path) == []
    # With --force the previous report survives an interrupted replacement.
    out.mkdir()
    (out / "index.html").write_text("previous")
    (out / "run.json").write_text(json.dumps({"headscope": "0", "files": {"report": "index.html"}}))
    result = CliRunner().invoke(cli, ["run", "--model", "bert", "--report", str(out), "--force", *FAST])
    assert result.exit_code == 130
    assert (out / "index.html").read_text() == "previous" and _leftovers(tmp_path) == []


def test_write_folder_restores_the_old_folder_when_the_move_fails(tmp_path, monkeypatch):
    from headscope.probe.folders import write_folder
    from headscope.reports.folder import not_a_report

    out = tmp_path / "r"
    out.mkdir()
    (out / "a").write_text("old")
    record = json.dumps({"headscope": "0", "files": {"report": "a"}})  # a report: --force may replace it
    (out / "run.json").write_text(record)
    write_folder(out, lambda d: [(d / "a").write_text("new"), (d / "run.json").write_text(record)],
                 replace=not_a_report)
    assert (out / "a").read_text() == "new" and _leftovers(tmp_path) == []
    with pytest.raises(RuntimeError):
        write_folder(out, lambda d: (_ for _ in ()).throw(RuntimeError("boom")), replace=not_a_report)
    assert (out / "a").read_text() == "new" and _leftovers(tmp_path) == []


@pytest.mark.parametrize(("args", "message"), [
    (["--corpus", "no/such/file.txt"], "--corpus no/such/file.txt: no such file"),
    (["--coref", "no/such/probe.jsonl"], "--coref no/such/probe.jsonl: no such file"),
    (["--text", "  "], "--text 1 is empty"),
    (["--model", "bert", "--model", "bert"], "named twice"),
])
def test_bad_input_is_a_clear_error_before_any_work(tiny_models, tmp_path, args, message):
    out = tmp_path / "report"
    result = CliRunner().invoke(cli, ["run", "--report", str(out), *args])
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output
    assert not out.exists()


def test_a_bad_corpus_line_names_file_and_line(tiny_models, tmp_path):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"text": "fine"}\n{"txt": "typo"}\n')
    result = CliRunner().invoke(cli, ["run", "--model", "bert", "--corpus", str(corpus), "--report", str(tmp_path / "r")])
    assert result.exit_code == 2 and "line 2" in result.output and "Traceback" not in result.output


def test_unknown_model_is_a_clear_error(tmp_path):
    result = CliRunner().invoke(cli, ["run", "--model", "no-such-model-xyz", "--report", str(tmp_path / "r"), "--quiet"])
    assert result.exit_code == 2 and "no-such-model-xyz" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "r").exists()


def test_corpus_stats_counts_words_and_tokens():
    lm = _tiny("bert")
    stats = hs.corpus_stats(lm.tokenizer, [("c", "here", ["It didn't rain.", "我爱北京"])])
    row = stats.iloc[0]
    assert (row["texts"], row["words"]) == (2, 4 + 4)
    n_tokens = sum(len(lm.tokenizer(t)["input_ids"]) for t in ["It didn't rain.", "我爱北京"])
    assert row["tokens"] == n_tokens and row["tokens_per_word"] == pytest.approx(n_tokens / 8)


@pytest.mark.slow
def test_default_model_end_to_end(tmp_path, draw_only):
    # the figures asserted; every figure of a real model's report is drawn by the quickstart notebook's hs.report
    # (tests/test_notebook.py), every figure of a run by test_two_models_one_side_by_side_report
    draw_only("attention_mosaic", "rollout")
    out = tmp_path / "minilm"
    result = CliRunner().invoke(cli, ["run", "--report", str(out), "--limit", "40", "--permutations", "1000",
                                      "--coref", _small_probe(), "--quiet"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    record = json.loads((out / "run.json").read_text())
    (model,) = record["models"]
    assert model["model"] == "minilm" and model["verified"] is True
    assert model["verification"]["max_abs_err"] < 1e-5
    assert model["heads"]["n_texts"] == 40
    (probe,) = model["probes"]  # MiniLM's L1H3 resolves the agreement pronouns (97% held out)
    assert probe["best_head"] == {"layer": 1, "head": 3} and probe["heldout_accuracy"] > 0.9
    html = (out / "index.html").read_text(encoding="utf-8")
    assert "attention verified" in html and "The animal didn&#39;t cross the street" in html
    assert (out / "figures" / "minilm-model-view.png").stat().st_size > 10_000
    # ablation evidence is on by default for an encoder: 72 heads ablated alone on 32 of the 40 texts
    assert model["ablation"]["n_texts"] == 32 and len(model["ablation"]["heads"]) == 72
    assert "<h3>Ablation evidence</h3>" in html and (out / "figures" / "minilm-rollout-0.png").exists()


def test_recorded_versions_are_the_installed_packages():
    from importlib import metadata

    v = hs.versions()
    assert v["headscope"] == hs.__version__ == metadata.version("headscope")
    for dist in ("torch", "transformers", "numpy", "pandas", "matplotlib", "seaborn", "jinja2"):
        assert v[dist] == metadata.version(dist), dist
    assert v["python"] == ".".join(map(str, sys.version_info[:3]))


def test_run_json_prints_the_run_record(tiny_models, tmp_path, draw_only):
    draw_only()  # the record printed is the one written, whatever was drawn
    out = tmp_path / "report"
    result = _invoke("--model", "llama", "--out", str(out), "--json", *FAST)
    assert result.exit_code == 0, result.output
    printed = json.loads(result.stdout)
    assert printed == json.loads((out / "run.json").read_text())
    assert printed["versions"] == hs.versions()


def test_analyse_model_without_probe_sets_has_no_probe_stage_and_reports(tmp_path, draw_only):
    """`hs.analyse_model(lm, texts, [], settings)`: no probe sets is no probe stage (it failed in pandas'
    concat with "No objects to concatenate"), and the report of it is written, with no probe section."""
    from dataclasses import asdict

    draw_only()
    settings = hs.RunSettings(corpus="c", coref="none", texts=("The cat sat.",), permutations=100,
                              induction_sequences=0)
    analysis = hs.analyse_model(_tiny("llama"), ["A dog ran."] * 4, [], settings)
    assert analysis.probes == () and "coref" not in analysis.seconds
    assert analysis.verification.passed and analysis.scores.n_texts == 4
    folder = hs.report([analysis], tmp_path / "r", settings=asdict(settings), workers=1)
    assert json.loads((folder.path / "run.json").read_text())["models"][0]["probes"] == []
