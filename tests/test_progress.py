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


def _pairs(tmp_path) -> str:
    path = tmp_path / "pairs.jsonl"
    path.write_text('{"clean": "When Mary and John went to the store, John gave a drink to", '
                    '"corrupt": "When Mary and John went to the store, Mary gave a drink to", '
                    '"right": " Mary", "wrong": " John"}\n', encoding="utf-8")
    return str(path)


def _verify_steps() -> str:
    from headscope.probe.verify import DEFAULT_TEXTS

    return f"{-(-len(DEFAULT_TEXTS) // 8) * 2}/{-(-len(DEFAULT_TEXTS) // 8) * 2}"  # batches of 8 × tiny:llama's 2 layers


PROMPT = "When Mary and John went to the store, John gave a drink to"
# (command, the bar's name, its last count): tiny:llama has 2 layers × 4 heads; one pair of patching is the clean
# run, the corrupt run and one forward for all 8 heads (no held-out check under 4 pairs)
BARS = {
    "verify": (["verify", "--model", "tiny:llama"], "tiny:llama verify", _verify_steps),
    "composition": (["composition", "--model", "tiny:llama"], "tiny:llama composition", lambda: "1/1"),
    "generate": (["generate", "--model", "tiny:llama", "--prompt", "The cat", "--max-new-tokens", "3"],
                 "tiny:llama generate", lambda: "/3"),
    "dla": (["dla", "--model", "tiny:llama", "--prompt", PROMPT, "--answer", " Mary", "--wrong", " John"],
            "tiny:llama forward", lambda: "2/2"),
    "qk": (["qk", PROMPT, "--model", "tiny:llama", "--head", "L1H0", "--query", "3", "--key", "1"],
           "tiny:llama forward", lambda: "2/2"),
    "patch": (["patch", "--model", "tiny:llama", "--pairs", "PAIRS"], "tiny:llama patch head_out", lambda: "3/3"),
    "patch --attribution": (["patch", "--model", "tiny:llama", "--pairs", "PAIRS", "--attribution"],
                            "tiny:llama attribution patching", lambda: "3/3"),
}


@pytest.mark.parametrize("name", BARS)
def test_a_command_shows_a_bar_and_quiet_shows_nothing(name, tmp_path):
    # Was: patch, composition, verify, generate, dla and qk ran for seconds to minutes on smollm2 without a word.
    args, desc, count = BARS[name]
    args = [_pairs(tmp_path) if a == "PAIRS" else a for a in args]
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 0, res.output
    assert desc in res.stderr and count() in res.stderr, res.stderr
    quiet = CliRunner().invoke(cli, [*args, "--quiet"])
    assert quiet.exit_code == 0 and quiet.stderr == ""
    assert _numbers_masked(quiet.stdout) == _numbers_masked(res.stdout)  # the same output (timings aside)


def _numbers_masked(text: str) -> str:
    import re

    return re.sub(r"\d+(\.\d+)?", "#", text)
