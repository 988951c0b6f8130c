"""Static tools follow the house: `headscope.probe`, `.analyses` and `.reports` are plain folders of the
installed package (symlinks to the rooms at the repository root), not names mapped by an import hook,
so jedi (IPython's and Jupyter's completion and go-to-definition) and pyright resolve them."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(("code", "column", "home"), [
    ("from headscope.probe.extract import extract\n", 38, "probe/extract.py"),
    ("from headscope.analyses.heads import HeadScores\n", 38, "analyses/heads.py"),
    ("from headscope.reports.figures import plot\n", 40, "reports/figures.py"),
])
def test_jedi_resolves_the_rooms(tmp_path, code, column, home):
    jedi = pytest.importorskip("jedi", reason="jedi is not installed (it comes with ipython)")
    # A script outside the repository, so only the installed package can answer (not the working directory).
    script = jedi.Script(code, path=tmp_path / "notebook.py", project=jedi.Project(tmp_path),
                         environment=jedi.create_environment(sys.executable, safe=False))
    found = script.goto(1, column, follow_imports=True)
    assert found, f"jedi found no definition for {code.strip()!r}"
    assert Path(found[0].module_path).resolve() == ROOT / home


def test_the_rooms_are_links_into_the_package():
    for room in ("probe", "analyses", "reports"):
        link = ROOT / "headscope" / room
        assert link.is_symlink() and link.resolve() == ROOT / room, f"headscope/{room} must link to {room}/"
