"""Long work shows a sign of life on stderr (`probe.progress`, one bar for every room), and --quiet turns it off."""

from __future__ import annotations

import ast
import pathlib

import pytest
from click.testing import CliRunner

from headscope.cli import cli

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_every_bar_is_the_one_helpers_plain_bar():
    # tqdm.auto in a notebook without ipywidgets opened the first cell with "IProgress not found"; every bar now
    # comes from probe.progress, which uses tqdm's plain form.
    from headscope.probe.progress import progress

    with progress(total=1, enabled=True) as bar:
        assert type(bar).__module__ == "tqdm.std"
    others = []
    for room in ("probe", "analyses", "reports", "headscope"):
        for path in (ROOT / room).rglob("*.py"):
            if path.name == "progress.py" and path.parent.name == "probe":
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                names = [node.module or ""] if isinstance(node, ast.ImportFrom) else \
                    [a.name for a in node.names] if isinstance(node, ast.Import) else []
                others += [f"{path.relative_to(ROOT)}: {n}" for n in names if n.split(".")[0] == "tqdm"]
    assert not others, others


@pytest.mark.parametrize("how", [["--heads", "L0H1"], ["--heads-by", "induction:1"]])
def test_ablate_shows_its_passes_and_quiet_shows_nothing(how, tmp_path):
    # Was: `headscope ablate --top induction:5 --task induction` printed nothing for minutes.
    corpus = tmp_path / "c.txt"
    corpus.write_text("The cat sat on the mat.\nA dog barked at the cat.\n", encoding="utf-8")
    args = ["ablate", "--model", "tiny:gpt2", *how, "--corpus", str(corpus), "--random", "1"]
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 0, res.output
    assert "tiny:gpt2 ablation" in res.stderr and "3/3" in res.stderr  # clean, the heads, 1 random set
    if how[0] == "--heads-by":
        assert "tiny:gpt2 heads" in res.stderr  # the scores that pick the heads
    quiet = CliRunner().invoke(cli, [*args, "--quiet"])
    assert quiet.exit_code == 0 and quiet.stderr == "" and quiet.stdout == res.stdout


def test_importance_shows_its_texts_and_quiet_shows_nothing(tmp_path):
    corpus = tmp_path / "c.txt"
    corpus.write_text("The cat sat on the mat.\nA dog barked at the cat.\nIt rained.\n", encoding="utf-8")
    args = ["importance", "--model", "tiny:gpt2", "--corpus", str(corpus), "--batch-size", "2"]
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 0 and "tiny:gpt2 importance" in res.stderr and "3/3" in res.stderr, res.output
    quiet = CliRunner().invoke(cli, [*args, "--quiet"])
    assert quiet.exit_code == 0 and quiet.stderr == "" and quiet.stdout == res.stdout
