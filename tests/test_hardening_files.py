"""Report folders under hostile use, third pass (issue 24, items 1-3): Ctrl-C while the new report is
put in place, glob characters in `--out`, and a symlinked `--out`.

The subprocess tests use the stub driver of test_cli_hardening (no model, no drawing).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import one_line
from test_cli_hardening import _driven, _leftovers, _previous_report, _run, stub_run  # noqa: F401

from headscope.probe.folders import OLD, reclaim_stale, temporary_name, write_folder
from headscope.reports.folder import not_a_report

# The writer's steps (see test_cli_hardening): 1 index.html, 2-5 the tables, 6/7 before/after the old report
# moves aside, 8/9 before/after the new one moves in.


@pytest.mark.parametrize("point", [7, 9])
def test_ctrl_c_at_any_step_either_keeps_the_old_report_or_completes_and_says_which(point, tmp_path):
    out = tmp_path / "report"
    _previous_report(out)
    done = _driven(f"sigint:{point}", out, "--force")
    last = done.stderr.splitlines()[-1] if done.stderr.strip() else ""
    if done.returncode == 130:
        assert last == "headscope: interrupted; nothing was written or replaced", done.stderr
        assert (out / "index.html").read_text() == "previous"
    else:
        assert done.returncode == 0, done.stderr
        assert (out / "index.html").read_text() == "<p>new</p>"
        assert "Ctrl-C came while" in done.stderr and "the run finished" in done.stderr
    assert "Traceback" not in done.stderr and _leftovers(tmp_path) == []


@pytest.mark.parametrize("hook", ["sigint:after", "sigint:exit"])
def test_ctrl_c_after_the_report_is_in_place_finishes_with_0_and_says_it_came_too_late(hook, tmp_path):
    # Seen (issue 35): Ctrl-C once the new report was in place printed "wrote ...", and then the process died
    # by SIGINT (130) or said "interrupted; nothing was written or replaced": a script read failure although the
    # report had been replaced. Now: the report stands, exit 0, and a Ctrl-C still inside the command says so.
    out = tmp_path / "report"
    _previous_report(out)
    done = _driven(hook, out, "--force")
    assert done.returncode == 0, done.stderr
    assert (out / "index.html").read_text() == "<p>new</p>" and _leftovers(tmp_path) == []
    assert "nothing was written" not in done.stderr and "Traceback" not in done.stderr
    assert "Exception ignored" not in done.stderr and "KeyboardInterrupt" not in done.stderr
    if hook == "sigint:after":
        assert f"Ctrl-C came after {out} was in place; it is complete, so the command finished" in done.stderr


def test_a_committed_cue_turns_later_interrupts_into_late_ones_outward_and_not_before(tmp_path):
    from headscope.common import Interrupts

    with Interrupts() as outer:
        with Interrupts() as inner:
            with pytest.raises(KeyboardInterrupt):
                signal.raise_signal(signal.SIGINT)  # before any output: it stops the command
            assert inner.received and outer.received
            inner.received = outer.received = False
            seen = []
            write_folder(tmp_path / "r", lambda d: (d / "a").write_text("x"),
                         committed=lambda: (seen.append((tmp_path / "r" / "a").exists()), inner.commit("r")))
            assert seen == [True]  # called once, when the new folder is in place
            signal.raise_signal(signal.SIGINT)  # afterwards: remembered as late, not raised
            inner.check()
        assert inner.late and outer.late and outer.committed == "r" and not outer.received
        signal.raise_signal(signal.SIGINT)  # the outer guard, committed through the inner one
        outer.check()


def test_ctrl_c_while_replacing_in_process_finishes_the_replacement_and_warns(tmp_path):
    out = tmp_path / "r"
    _previous_report(out)
    code = textwrap.dedent(f"""
        import os, shutil, signal, warnings
        from pathlib import Path
        import headscope.probe.folders as folders
        real = shutil.rmtree
        def rmtree(path, *a, **kw):  # the old folder is being deleted when Ctrl-C comes
            os.kill(os.getpid(), signal.SIGINT)
            real(path, *a, **kw)
        folders.shutil.rmtree = rmtree
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            folders.write_folder(Path({str(out)!r}), lambda d: (d / "index.html").write_text("new"),
                                 replace=lambda t: None)
        print(seen[0].message)
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "Ctrl-C came while" in done.stdout
    assert (out / "index.html").read_text() == "new" and _leftovers(tmp_path) == []


def test_a_moved_aside_report_without_its_lock_is_reclaimed(tmp_path):
    """What an interrupted cleanup used to leave: `.DIR.old-<token>` after its lock file was removed."""
    out = tmp_path / "report"
    out.mkdir()
    (out / "index.html").write_text("new")
    stale = tmp_path / temporary_name("report", "123-0abc", OLD)
    stale.mkdir()
    (stale / "index.html").write_text("half deleted")
    half = tmp_path / temporary_name("report", "124-0abd")
    half.mkdir()
    reclaim_stale(tmp_path, "report")
    assert _leftovers(tmp_path) == [] and (out / "index.html").read_text() == "new"


@pytest.mark.parametrize("name, other", [("r[1]", "r1"), ("r*", "rA"), ("r?", "rb"), ("a.partial-1-x", "a")])
def test_glob_characters_in_a_name_touch_only_its_own_temporaries(name, other, tmp_path):
    mine = tmp_path / temporary_name(name, "11-aa")
    mine.mkdir()
    theirs = tmp_path / temporary_name(other, "12-bb", OLD)
    theirs.mkdir()
    (tmp_path / other).mkdir()  # so that theirs would be deleted, not moved back, by a cleaner of `other`
    reclaim_stale(tmp_path, name)
    assert not mine.exists() and theirs.exists()


def test_a_report_named_with_glob_characters_is_replaced_and_leaves_nothing(stub_run, tmp_path):
    out = tmp_path / "r[1]"
    _previous_report(out)
    neighbour = tmp_path / temporary_name("r1", "99-cafe", OLD)  # another report's backup: not ours
    neighbour.mkdir()
    assert _run("--report", str(out), "--force").exit_code == 0
    assert (out / "index.html").read_text() == "<p>new</p>"
    assert _leftovers(tmp_path) == [neighbour.name]


@pytest.mark.parametrize("dangling", [False, True])
def test_a_symlinked_out_is_refused_before_any_work(dangling, stub_run, tmp_path):
    target = tmp_path / "real"
    if not dangling:
        _previous_report(target)
    link = tmp_path / "link"
    link.symlink_to(target)
    result = _run("--report", str(link), "--force")
    assert result.exit_code == 2
    assert "is a symbolic link" in one_line(result)
    assert link.is_symlink() and _leftovers(tmp_path) == []
    assert dangling or (target / "index.html").read_text() == "previous"


def test_write_folder_refuses_a_symlink(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with pytest.raises(FileExistsError, match="symbolic link"):
        write_folder(tmp_path / "link", lambda d: None, replace=not_a_report)
    assert (tmp_path / "link").is_symlink() and _leftovers(tmp_path) == []


# ---------------------------------------------------------------- 4. two outputs, one file


@pytest.mark.parametrize("clusters", ["same.csv", "./same.csv", "sub/../same.csv"])
def test_syntax_refuses_out_and_clusters_naming_one_file(clusters, tmp_path, monkeypatch):
    from click.testing import CliRunner

    from headscope.cli import cli

    monkeypatch.chdir(tmp_path)
    (tmp_path / "sub").mkdir()
    result = CliRunner().invoke(cli, ["syntax", "--model", "tiny:bert", "--conllu", "missing.conllu",
                                      "--out", "same.csv", "--clusters", clusters])
    assert result.exit_code == 2
    line = one_line(result)
    assert "--clusters" in line and "--out" in line and "same file" in line
    assert not (tmp_path / "same.csv").exists()


# ---------------------------------------------------------------- 5. files get the user's umask


@pytest.fixture
def umask_002():
    previous = os.umask(0o002)
    yield 0o664
    os.umask(previous)


@pytest.mark.parametrize("suffix", [".csv", ".json", ".parquet"])
def test_tables_get_the_users_umask_even_over_an_existing_file(suffix, umask_002, tmp_path):
    import pandas as pd

    from headscope.common import write_table

    path = tmp_path / f"t{suffix}"
    write_table(pd.DataFrame({"a": [1]}), path)
    assert path.stat().st_mode & 0o777 == umask_002
    path.chmod(0o660)
    write_table(pd.DataFrame({"a": [2]}), path)  # --force over an existing file: a new file, the umask's mode
    assert path.stat().st_mode & 0o777 == umask_002 and _leftovers(tmp_path) == []


def test_written_folders_get_the_users_umask(umask_002, tmp_path):
    """The report folder and the GGUF cache entries are written by write_folder."""
    write_folder(tmp_path / "entry", lambda d: (d / "f").write_text("x"))
    assert (tmp_path / "entry").stat().st_mode & 0o777 == 0o775
    assert (tmp_path / "entry" / "f").stat().st_mode & 0o777 == umask_002


@pytest.mark.parametrize("dangling", [False, True])
def test_a_symlinked_table_out_is_refused_before_any_work(dangling, tmp_path):
    from click.testing import CliRunner

    from headscope.cli import cli

    target = tmp_path / "real.csv"
    if not dangling:
        target.write_text("the user's table\n")
    link = tmp_path / "link.csv"
    link.symlink_to(target)
    result = CliRunner().invoke(cli, ["heads", "--model", "no-such-model", "--out", str(link), "--force"])
    assert result.exit_code == 2 and "is a symbolic link" in one_line(result)
    assert link.is_symlink() and (dangling or target.read_text() == "the user's table\n")


# ---------------------------------------------------------------- 6. file names over 255 bytes


def test_long_slugs_are_capped_and_stay_distinct():
    from headscope.reports.panels import slug

    a, b = "/data/" + "checkpoints/" * 30 + "step-1000", "/data/" + "checkpoints/" * 30 + "step-2000"
    assert len(slug(a)) <= 60 and len(slug(b)) <= 60 and slug(a) != slug(b)
    assert slug(a) == slug(a) and slug("minilm") == "minilm"


def test_a_report_of_a_model_with_a_very_long_name_is_written(tmp_path):
    from report_samples import verification

    from headscope.reports.analysis import ModelAnalysis
    from headscope.reports.folder import report

    name = "/models/" + "a-very-long-folder-name/" * 15 + "model"  # 368 characters
    written = report([ModelAnalysis(model=name, verification=verification(name))], tmp_path / "r")
    assert written.figures and all(len(os.fsencode(Path(f).name)) <= 255 for f in written.figures)
    assert all((tmp_path / "r" / f).is_file() for f in written.figures)


@pytest.mark.parametrize("size", [220, 300])
def test_an_out_name_too_long_for_the_file_system_is_refused_before_any_work(size, stub_run, tmp_path):
    from click.testing import CliRunner

    from headscope.cli import cli

    result = _run("--report", str(tmp_path / ("r" * size)))
    assert result.exit_code == 2 and "bytes" in one_line(result)
    table = CliRunner().invoke(cli, ["heads", "--model", "no-such-model", "--out", str(tmp_path / ("t" * size + ".csv"))])
    assert table.exit_code == 2 and "bytes" in one_line(table)
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------- 11. --width out of range, before any work


@pytest.mark.parametrize("args", [["--width", "1000in"], ["--width", "0.001pt"], ["--width", "30in", "--dpi", "1200"],
                                  ["--width", "1in", "--dpi", "10"]])
def test_a_width_out_of_range_is_refused_before_any_work(args, stub_run, tmp_path):
    result = _run("--report", str(tmp_path / "r"), *args)
    assert result.exit_code == 2 and "--width" in one_line(result)
    assert list(tmp_path.iterdir()) == []


def test_the_report_api_checks_the_width_before_drawing(tmp_path):
    from headscope.reports.folder import report

    with pytest.raises(ValueError, match="pixels wide"):
        report([], tmp_path / "r", width=40.0, dpi=1200)
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------- smaller: model names checked first


@pytest.mark.parametrize("name, says", [("minilm@main", "minilm is a packaged model, which has no revisions"),
                                        ("tiny:bert@v1", "tiny:bert is a tiny model, which has no revisions"),
                                        ("tiny:nope", "no tiny model for 'nope'")])
def test_model_names_that_can_never_load_are_refused_by_name(name, says):
    from headscope.probe.loading import check_name
    from headscope.probe.registry import ModelNotAvailable

    with pytest.raises(ModelNotAvailable, match=says):
        check_name(name)


def test_a_bad_second_model_is_reported_before_the_first_is_loaded(monkeypatch, tmp_path):
    from click.testing import CliRunner

    from headscope.cli import cli
    from headscope.commands import run as run_mod

    loaded = []
    monkeypatch.setattr(run_mod, "load_or_fail", lambda name, *a: loaded.append(name))
    result = CliRunner().invoke(cli, ["run", "--model", "tiny:bert", "--model", "minilm@main", "--report",
                                      str(tmp_path / "r"), "--quiet"])
    assert result.exit_code == 2 and "minilm is a packaged model, which has no revisions" in one_line(result)
    assert loaded == [] and list(tmp_path.iterdir()) == []


def test_a_figure_whose_write_fails_half_way_leaves_no_half_file(tmp_path, monkeypatch, capsys):
    # dla, patch and composition --figure (and syntax --clusters) wrote straight into the file: a full disk or a
    # Ctrl-C mid-write left half a PNG under the user's name. Now it goes through a temporary sibling.
    from pathlib import Path

    import matplotlib.figure

    from headscope.common.outputs import write_figure

    real = Path.write_bytes

    def half(self, data):
        real(self, data[: len(data) // 2])
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Path, "write_bytes", half)
    target = tmp_path / "grid.png"
    with pytest.raises(SystemExit) as done:
        write_figure(matplotlib.figure.Figure(figsize=(1, 1)), target)
    assert done.value.code == 2 and not target.exists() and list(tmp_path.iterdir()) == []
    assert capsys.readouterr().err.strip() == f"headscope: could not write {target}: No space left on device"
