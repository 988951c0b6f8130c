"""The doc tests themselves (conftest.py at the root): every fence of the pages is one the tests run or a
`text` fence, and a page whose shown number or option name drifts from what the code prints fails."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RUN = {"python", "bash", "console"}
SHOWN = {"text"}  # synopses, diagrams, listings: shown, never run
_OPEN = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>[^`\n]*)$")


def _pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _fences(text: str) -> list[tuple[int, str]]:
    """(line, info string) of every opening fence."""
    found, open_fence = [], None
    for number, line in enumerate(text.splitlines(), 1):
        match = _OPEN.match(line)
        if not match:
            continue
        if open_fence is None:
            open_fence = match["fence"]
            found.append((number, match["info"].strip()))
        elif match["fence"][0] == open_fence[0] and len(match["fence"]) >= len(open_fence) and not match["info"].strip():
            open_fence = None
    return found


@pytest.mark.parametrize("page", _pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_fence_is_run_or_shown_as_text(page):
    odd = [(line, info) for line, info in _fences(page.read_text(encoding="utf-8")) if info not in RUN | SHOWN]
    assert not odd, (f"{page.relative_to(ROOT)}: fences the doc tests neither run nor know as text, (line, info): {odd}; "
                     "label each python, bash or console (run), or text (a synopsis, a diagram: shown only)")


def test_fence_finder():
    text = "a\n```python\nx = 1\n```\n````text\n```bash\n````\n```\nplain\n```\n"
    assert _fences(text) == [(2, "python"), (5, "text"), (8, "")]


@pytest.fixture(scope="module")
def docs_sybil():
    spec = importlib.util.spec_from_file_location("headscope_docs_conftest", ROOT / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module._sybil()


def _outcomes(sybil, tmp_path, markdown: str) -> list[str]:
    """'ok' or 'failed: ...' per example of a page made of `markdown`, evaluated as the doc tests do."""
    page = tmp_path / "page.md"
    page.write_text(markdown, encoding="utf-8")
    document = sybil.parse(page)
    sybil.setup(document.namespace)
    outcomes = []
    try:
        for example in document.examples():
            try:
                example.evaluate()
                outcomes.append("ok")
            except Exception as error:  # noqa: BLE001 - a failing example is what the test looks at
                outcomes.append(f"failed: {type(error).__name__}")
    finally:
        sybil.teardown(document.namespace)
    return outcomes


def test_a_shown_number_that_drifts_fails(docs_sybil, tmp_path):
    page = ("```console\n$ printf 'max |Δ| = %.1e\\n' 3.6e-07\nmax |Δ| = {shown}\n```\n"
            "```python\n>>> round(2 / 3, 3)\n{python}\n```\n")
    assert _outcomes(docs_sybil, tmp_path, page.format(shown="3.6e-07", python="0.667")) == ["ok", "ok"]
    assert _outcomes(docs_sybil, tmp_path, page.format(shown="3.0e-07", python="0.67")) == ["failed: SybilFailure"] * 2


def test_a_wrong_option_name_fails(docs_sybil, tmp_path):
    page = "```bash\nheadscope models {option}\n```\n"
    assert _outcomes(docs_sybil, tmp_path, page.format(option="--families")) == ["ok"]
    assert _outcomes(docs_sybil, tmp_path, page.format(option="--family")) == ["failed: SybilFailure"]


def test_blocks_run_in_the_page_folder_with_the_examples(docs_sybil, tmp_path):
    page = ("```bash\ntest -f examples/photo.jpg && echo made > made.txt\n```\n"
            "```python\n>>> open('made.txt').read()\n'made\\n'\n```\n")
    assert _outcomes(docs_sybil, tmp_path, page) == ["ok", "ok"]
