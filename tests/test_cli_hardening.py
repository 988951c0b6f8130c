"""The CLI under hostile use: it never deletes what it did not write, checks every output before
any compute, survives Ctrl-C and SIGKILL, and answers every bad argument with one line.

Subprocess tests run `headscope run` with the analyses and drawing swapped for stubs (the driver
below), so what they exercise is the writing, the signals and the exit codes, in about a second.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import one_line
from click.testing import CliRunner

from headscope.cli import cli
from headscope.commands import run as run_mod
from headscope.probe.folders import reclaim_stale
from headscope.reports.folder import not_a_report


def _small_probe() -> str:
    from headscope.analyses.relations import builtin_path

    return str(builtin_path("agreement"))


@pytest.fixture
def stub_run(monkeypatch):
    """`headscope run` without the model, the analyses or the drawing: a report of three tables."""
    import pandas as pd
    from report_samples import verification

    from headscope.reports.analysis import ModelAnalysis
    from headscope.reports.html import Report

    monkeypatch.setattr(run_mod, "load_or_fail", lambda name, *a: type("LM", (), {"name": name, "source": "stub"})())
    monkeypatch.setattr(run_mod, "models_or_fail", lambda *a, **kw: None)  # test model names are not real ones
    monkeypatch.setattr(run_mod, "too_long_or_fail", lambda *a, **kw: None, raising=False)
    monkeypatch.setattr("headscope.workflows.run.analyse_model",
                        lambda lm, *a, **kw: ModelAnalysis(model="stub", verification=verification("stub")))
    monkeypatch.setattr("headscope.reports.folder.build_report", lambda analyses, **kw: Report(
        html="<p>new</p>", figures=(), tables={f"t{i}": pd.DataFrame({"a": [i]}) for i in range(3)}))


def _run(*args):
    return CliRunner().invoke(cli, ["run", "--model", "stub", "--limit", "2", "--quiet", "--coref", _small_probe(),
                                    *args])




def _leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


# ---------------------------------------------------------------- 1. --force never deletes a user's files


def test_force_refuses_the_working_directory_and_its_ancestors(stub_run, tmp_path, monkeypatch):
    work = tmp_path / "v"
    work.mkdir()
    (work / "n.txt").write_text("x")
    monkeypatch.chdir(work)
    for out in (".", "..", str(work), str(tmp_path)):
        result = _run("--report", out, "--force")
        assert result.exit_code == 2 and "working directory" in one_line(result)
    assert (work / "n.txt").read_text() == "x" and sorted(p.name for p in work.iterdir()) == ["n.txt"]


def test_force_replaces_only_a_folder_headscope_wrote(stub_run, tmp_path):
    user = tmp_path / "mine"
    user.mkdir()
    (user / "n.txt").write_text("keep")
    result = _run("--report", str(user), "--force")
    assert result.exit_code == 2 and "did not write" in one_line(result)
    assert (user / "n.txt").read_text() == "keep"

    report = tmp_path / "report"
    assert _run("--report", str(report)).exit_code == 0
    (report / "index.html").write_text("old")
    assert _run("--report", str(report), "--force").exit_code == 0  # a report is replaced whole
    assert (report / "index.html").read_text() == "<p>new</p>"

    (report / "notes.md").write_text("mine")  # a report the user added a file to is no longer ours
    (report / "figures" / "sketch.png").write_bytes(b"png")
    result = _run("--report", str(report), "--force")
    assert result.exit_code == 2 and "figures/sketch.png" in one_line(result)
    assert (report / "notes.md").read_text() == "mine" and (report / "figures" / "sketch.png").exists()
    assert _leftovers(tmp_path) == []


def test_a_folder_is_a_report_only_when_its_run_json_lists_everything(tmp_path):
    folder = tmp_path / "r"
    folder.mkdir()
    assert not_a_report(folder) is None  # empty: nothing to lose
    (folder / "index.html").write_text("x")
    assert "no run.json" in not_a_report(folder)
    (folder / "run.json").write_text("[1, 2]")
    assert "not a headscope run record" in not_a_report(folder)
    record = {"headscope": "0", "files": {"report": "index.html", "figures": ["figures/a.png"], "tables": ["t.csv"]}}
    (folder / "run.json").write_text(json.dumps(record))
    (folder / "figures").mkdir()
    (folder / "figures" / "a.png").write_bytes(b"")
    (folder / "t.csv").write_text("")
    assert not_a_report(folder) is None
    (folder / "t.csv").unlink()
    (folder / "t.csv").mkdir()  # a listed name that is a folder, not the file headscope wrote
    assert "t.csv" in not_a_report(folder)


# ---------------------------------------------------------------- 6. outputs checked before any compute


def _no_model(*args, **kwargs):
    raise AssertionError("the model was loaded before the output was checked")


@pytest.mark.parametrize("args", [
    ["run", "--report", "/proc/headscope-x/r"],
    ["heads", "--out", "/proc/headscope-x/s.csv"],
    ["heads", "--out", "/proc/s.csv"],
    ["verify", "--out", "/dev/null/s.csv"],
])
def test_an_output_that_cannot_be_written_fails_before_the_model_loads(args, monkeypatch):
    for module in ("run", "heads", "verify"):
        monkeypatch.setattr(f"headscope.commands.{module}.load_or_fail", _no_model)
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2 and ("--report" if args[0] == "run" else "--out") in one_line(result)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only folder anyway")
def test_a_read_only_folder_fails_before_the_model_loads(tmp_path, monkeypatch):
    monkeypatch.setattr("headscope.commands.heads.load_or_fail", _no_model)
    tmp_path.chmod(0o555)
    try:
        result = CliRunner().invoke(cli, ["heads", "--out", str(tmp_path / "s.csv")])
    finally:
        tmp_path.chmod(0o755)
    assert result.exit_code == 2 and "cannot write" in one_line(result)


def test_the_writability_check_leaves_nothing_behind(tmp_path):
    from headscope.common import writable_or_fail

    writable_or_fail(tmp_path / "a" / "b" / "s.csv", "--out")
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------- 10. --out FILE: --force, atomic, parents


def test_every_table_out_refuses_an_existing_file_unless_force(tmp_path):
    out = tmp_path / "models.csv"
    out.write_text("mine\n")
    result = CliRunner().invoke(cli, ["models", "--out", str(out)])
    assert result.exit_code == 2 and "already exists" in one_line(result) and out.read_text() == "mine\n"
    result = CliRunner().invoke(cli, ["models", "--out", str(out), "--force"])
    assert result.exit_code == 0 and out.read_text().startswith("name,")
    assert _leftovers(tmp_path) == []


def test_a_failed_table_write_keeps_the_old_file(tmp_path, monkeypatch):
    from headscope import common

    out = tmp_path / "models.csv"
    out.write_text("mine\n")

    def half_then_fail(table, path):
        path.write_text("half")
        raise OSError(28, "No space left on device")

    monkeypatch.setitem(common.TABLE_WRITERS, ".csv", half_then_fail)
    result = CliRunner().invoke(cli, ["models", "--out", str(out), "--force"])
    assert result.exit_code == 2 and "No space left" in one_line(result)
    assert out.read_text() == "mine\n" and _leftovers(tmp_path) == []


@pytest.mark.parametrize("command", [
    ["models"],
    ["heads", "--model", "tiny:bert", "--limit", "2", "--induction-seqs", "0", "--no-verify", "--quiet"],
])
def test_table_outputs_create_missing_folders_like_run(command, tmp_path):
    out = tmp_path / "new" / "deeper" / "t.json"
    result = CliRunner().invoke(cli, [*command, "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert isinstance(json.loads(out.read_text()), list)


# ---------------------------------------------------------------- 10. messages


def test_explain_truncate_is_the_option_its_error_suggests(tmp_path):
    long = "cat " * 300  # the tiny models take 128 tokens
    args = ["explain", long, "--model", "tiny:bert", "--token", "cat", "--head", "L0H0"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2 and "--truncate" in one_line(result)
    result = CliRunner().invoke(cli, [*args, "--truncate", "--json"])
    assert result.exit_code == 0, result.output
    assert len(json.loads(result.stdout)["keys"]) == 128


def test_occurrence_counts_from_zero_and_refuses_negatives():
    import headscope as hs
    from headscope.probe.tiny import tiny_model

    result = CliRunner().invoke(cli, ["explain", "a cat", "--token", "cat", "--head", "L0H0", "--occurrence", "-1"])
    assert result.exit_code == 2 and "--occurrence" in one_line(result)
    with pytest.raises(ValueError, match="occurrence must be 0"):
        hs.explain(tiny_model("bert"), "a cat and a cat", token="cat", layer=0, head=0, occurrence=-1)


def test_heldout_errors_name_heldout(tmp_path):
    missing = str(tmp_path / "no.jsonl")
    result = CliRunner().invoke(cli, ["coref", "--data", _small_probe(), "--heldout", missing])
    line = one_line(result)
    assert result.exit_code == 2 and line.startswith(f"headscope: --heldout {missing}") and "--data" not in line


@pytest.mark.parametrize("command", [
    ["heads", "--induction-seqs", "0", "--no-verify"],
    ["run", "--coref", _small_probe(), "--permutations", "100", "--induction-seqs", "0"],
])
def test_a_corpus_line_too_long_for_the_model_is_named_by_file_and_line(command, tmp_path):
    corpus = tmp_path / "c.txt"
    corpus.write_text("short one\n\n" + "cat " * 300 + "\nshort two\n")  # the long text is on line 3
    extra = ["--report", str(tmp_path / "r")] if command[0] == "run" else []
    result = CliRunner().invoke(cli, [*command, "--model", "tiny:bert", "--corpus", str(corpus), "--quiet", *extra])
    assert result.exit_code == 2 and f"{corpus}, line 3:" in one_line(result) and "--truncate" in result.stderr
    assert not (tmp_path / "r").exists()


# ---------------------------------------------------------------- every command: one line, non-zero, no traceback


@pytest.mark.parametrize("args", [
    # bad model name
    ["verify", "--model", "no-such-model-xyz"],
    ["heads", "--model", "no-such-model-xyz"],
    ["explain", "a cat", "--token", "cat", "--head", "L0H0", "--model", "no-such-model-xyz"],
    ["coref", "--model", "no-such-model-xyz"],
    ["relations", "--model", "no-such-model-xyz"],
    ["generate", "--model", "no-such-model-xyz", "--prompt", "hi"],
    ["compare", "no-such-model-xyz", "no-such-model-abc"],
    ["run", "--model", "no-such-model-xyz", "--report", "{tmp}/r"],
    # missing file
    ["heads", "--corpus", "{tmp}/no.txt"],
    ["coref", "--data", "{tmp}/no.jsonl"],
    ["relations", "--data", "{tmp}/no.jsonl"],
    ["compare", "a", "b", "--corpus", "{tmp}/no.txt"],
    ["run", "--corpus", "{tmp}/no.txt", "--report", "{tmp}/r"],
    ["run", "--coref", "{tmp}/no.jsonl", "--report", "{tmp}/r"],
    # bad suffix
    ["heads", "--out", "{tmp}/s.txt"],
    ["verify", "--out", "{tmp}/s.xlsx"],
    ["models", "--out", "{tmp}/s"],
    ["explain", "a cat", "--token", "cat", "--head", "L0H0", "--out", "{tmp}/s.tsv"],
    ["coref", "--out", "{tmp}/s.html"],
    # bad head name
    ["explain", "a cat", "--token", "cat", "--head", "Lx"],
    ["explain", "a cat", "--token", "cat", "--head", "3"],
    ["coref", "--head", "zz"],
    ["relations", "--head", "L-1H2"],
    # bad numbers
    ["heads", "--limit", "0"],
    ["heads", "--batch-size", "x"],
    ["run", "--permutations", "5", "--report", "{tmp}/r"],
    ["explain", "a cat", "--token", "cat", "--head", "L0H0", "--occurrence", "-1"],
    ["coref", "--folds", "1"],
    ["compare", "a", "b", "--alpha", "2"],
    ["generate", "--prompt", "hi", "--max-new-tokens", "0"],
    ["verify", "--dtype", "float8"],
    # no such command or option
    ["nosuch"],
    ["heads", "--nosuch"],
])
def test_every_bad_argument_is_one_line_and_a_nonzero_exit(args, tmp_path):
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code not in (0, None), result.output
    assert one_line(result).startswith("headscope: ")
    assert not (tmp_path / "r").exists()


def test_an_unexpected_error_is_one_line_and_debug_shows_the_traceback(monkeypatch):
    def broken():
        raise ZeroDivisionError("division by zero\nsecond line")

    monkeypatch.setattr("headscope.probe.registry.model_table", broken)
    result = CliRunner().invoke(cli, ["models"])
    assert result.exit_code == 1
    assert one_line(result) == ("headscope: unexpected ZeroDivisionError: division by zero second line "
                                 "(--debug shows the traceback)")
    result = CliRunner().invoke(cli, ["--debug", "models"])
    assert isinstance(result.exception, ZeroDivisionError)


def test_headscope_warnings_print_as_one_clean_line(monkeypatch):
    import warnings

    def warn_then_list():
        warnings.warn("headscope: the cache folder /x cannot be used (Not a directory); loading without it.")
        return []

    monkeypatch.setattr("headscope.probe.registry.model_table", warn_then_list)
    result = CliRunner().invoke(cli, ["models"])
    assert result.exit_code == 0
    assert result.stderr == "headscope: the cache folder /x cannot be used (Not a directory); loading without it.\n"


# ---------------------------------------------------------------- 9. Ctrl-C and 4. SIGKILL, in a real process

# Runs `headscope run` with stubs for the model, the analyses and the drawing. HOOK picks what the
# report writer does: "sigint" sends SIGINT mid-write; "swallowed" sends it inside a finaliser
# (Python prints "Exception ignored" and drops the KeyboardInterrupt); "kill:N" SIGKILLs the process
# at its N-th step (a file written, a folder renamed), "sigint:N" sends it SIGINT there; "sigint:after" sends
# it once the report is written (before "wrote ..." is printed), "sigint:exit" while Python shuts down.
_DRIVER = textwrap.dedent("""
    import atexit, gc, os, signal, sys
    import pandas as pd
    import headscope.probe.folders as folders
    import headscope.reports.folder as report_folder
    import headscope.reports.html as html
    import headscope.workflows.run as workflow
    from headscope.commands import run as run_mod
    from headscope.cli import main
    from headscope.probe.results import LayerCheck, Verification
    from headscope.reports.analysis import ModelAnalysis

    hook = os.environ["HOOK"]
    steps = [0]

    def step():
        steps[0] += 1
        if hook == f"kill:{steps[0]}":
            os.kill(os.getpid(), signal.SIGKILL)
        if hook == f"sigint:{steps[0]}":
            os.kill(os.getpid(), signal.SIGINT)

    class Interrupter:
        def __del__(self):
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(1000):  # the handler runs here, inside the finaliser
                pass

    def write(self, folder):
        (folder / "index.html").write_text(self.html)
        step()
        if hook == "sigint":
            os.kill(os.getpid(), signal.SIGINT)
        if hook == "swallowed":
            Interrupter()
            gc.collect()
        for name, frame in self.tables.items():
            frame.to_csv(folder / f"{name}.csv", index=False)
            step()
        return []

    real_replace = os.replace

    def replace(src, dst):
        step()
        real_replace(src, dst)
        step()

    verified = Verification("stub", "bert", "float32", 1e-5, 1e-5, 1, 1, 1,
                            (LayerCheck(0, 0.0, 0.0, 0.0, 0.0, True),), 0.1, 0.1)

    html.Report.write = write
    folders.os.replace = replace
    run_mod.load_or_fail = lambda name, *a: type("LM", (), {"name": name, "source": "stub"})()
    run_mod.models_or_fail = lambda *a, **kw: None
    workflow.analyse_model = lambda lm, *a, **kw: ModelAnalysis(model="stub", verification=verified)
    report_folder.build_report = lambda analyses, **kw: html.Report(
        html="<p>new</p>", figures=(), tables={f"t{i}": pd.DataFrame({"a": [i]}) for i in range(4)})
    real_report = report_folder.report

    def report(*a, **kw):
        written = real_report(*a, **kw)
        if hook == "sigint:after":
            os.kill(os.getpid(), signal.SIGINT)
        return written

    report_folder.report = report  # what `from headscope import report` finds (the façade reads its home)
    if hook == "sigint:exit":
        atexit.register(os.kill, os.getpid(), signal.SIGINT)
    sys.argv = ["headscope", *sys.argv[1:]]
    main()
""")


def _driven(hook: str, out: Path, *args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-c", _DRIVER, "run", "--model", "stub", "--limit", "2", "--quiet", "--coref",
           _small_probe(), "--report", str(out), *args]
    return subprocess.run(cmd, env={**os.environ, "HOOK": hook}, capture_output=True, text=True, timeout=120)


def _previous_report(out: Path) -> None:
    """A report folder as an earlier run left it (its run.json lists its files)."""
    out.mkdir()
    (out / "index.html").write_text("previous")
    (out / "run.json").write_text(json.dumps({"headscope": "0", "files": {"report": "index.html"}}))


@pytest.mark.parametrize("hook", ["sigint", "swallowed"])
def test_ctrl_c_during_the_report_stops_the_run_with_130_and_keeps_the_previous_report(hook, tmp_path):
    out = tmp_path / "report"
    _previous_report(out)
    done = _driven(hook, out, "--force")
    assert done.returncode == 130, done.stderr
    assert done.stderr.splitlines()[-1] == "headscope: interrupted; nothing was written or replaced"
    if hook == "sigint":  # (in a finaliser Python itself prints "Exception ignored ... Traceback")
        assert "Traceback" not in done.stderr
    assert (out / "index.html").read_text() == "previous" and _leftovers(tmp_path) == []


def test_the_driver_without_a_hook_writes_the_report(tmp_path):
    out = tmp_path / "report"
    _previous_report(out)
    done = _driven("none", out, "--force")
    assert done.returncode == 0, done.stderr
    assert (out / "index.html").read_text() == "<p>new</p>" and _leftovers(tmp_path) == []


# The writer's steps: index.html, 4 tables, then the two renames (old report aside, new one in),
# each seen before and after: 1 + 4 + 4 = 9 points. A few, drawn with a fixed seed.
_KILL_POINTS = sorted(random.Random(15).sample(range(1, 10), 5))


@pytest.mark.parametrize("point", _KILL_POINTS)
def test_a_report_write_killed_at_any_point_leaves_nothing_stale_after_the_next_run(point, stub_run, tmp_path):
    out = tmp_path / "report"
    _previous_report(out)
    done = _driven(f"kill:{point}", out, "--force")
    assert done.returncode == -signal.SIGKILL, done.stderr
    reclaim_stale(out.absolute().parent, out.name)  # what the next run does first
    assert _leftovers(tmp_path) == []
    assert (out / "index.html").read_text() in ("previous", "<p>new</p>")  # never lost, never half
    result = _run("--report", str(out), "--force")
    assert result.exit_code == 0, result.output
    assert (out / "index.html").read_text() == "<p>new</p>" and _leftovers(tmp_path) == []


def test_a_closed_stdout_pipe_stops_quietly():
    """`headscope ... | head`: the reader leaves early; no "unexpected BrokenPipeError" line, exit 141."""
    import subprocess
    import sys

    # A command that prints far more than a pipe holds, registered on the real group, so the write fails.
    code = ("import click\nfrom headscope.cli import cli, main\n"
            "@cli.command()\ndef spew():\n    for _ in range(200):\n        click.echo('x' * 10_000)\nmain()")
    cmd = [sys.executable, "-c", code, "spew"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0)
    proc.stdout.read(1)
    proc.stdout.close()  # the reader is gone before the rest is printed
    stderr = proc.stderr.read().decode()
    proc.wait(timeout=120)
    assert "unexpected" not in stderr and "Traceback" not in stderr
    assert proc.returncode == 141
