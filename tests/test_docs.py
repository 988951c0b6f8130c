"""The documentation: the site builds with --strict, the README stays short and starts with its two
commands, every relative link points at a file, and the pages name what the code registers.

The build is mkdocs' own (`mkdocs.yml`, into a temporary folder): with `strict: true` a broken link
or anchor, a page missing from the nav or an API reference (`::: module.name` in docs/api.md) that
no longer resolves is a warning, and a warning fails the build. mkdocstrings reads the package
statically (griffe), so the build imports neither torch nor a model and takes seconds.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
README_MAX_LINES = 200

_FENCE = re.compile(r"^```.*?^```[ \t]*$", re.S | re.M)
_CODE_SPAN = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"\[[^\]\n]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_REFERENCE = re.compile(r"^\s{0,3}\[[^\]\n]+\]:\s*<?(\S+?)>?(?:\s+.*)?$", re.M)
_EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.I)  # http:, https:, mailto:, ...


def _pages() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def _prose(text: str) -> str:
    """Markdown without fenced code blocks and code spans, where a `[x](y)` is code, not a link."""
    return _CODE_SPAN.sub("", _FENCE.sub("", text))


def _relative_links(text: str) -> list[str]:
    prose = _prose(text)
    targets = _LINK.findall(prose) + _REFERENCE.findall(prose)
    return [t for t in targets if not _EXTERNAL.match(t) and not t.startswith("#")]


def test_site_builds_strict(tmp_path):
    missing = [m for m in ("mkdocs", "mkdocstrings", "mkdocstrings_handlers.python")
               if importlib.util.find_spec(m.split(".")[0]) is None]
    assert not missing, f"{', '.join(missing)} missing: they are dev dependencies (pip install -e '.[dev]')"
    site = tmp_path / "site"
    run = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(ROOT / "mkdocs.yml"),
                          "--site-dir", str(site)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    log = run.stdout + run.stderr
    assert run.returncode == 0, f"mkdocs build --strict failed:\n{log}"
    warnings = [line for line in log.splitlines() if line.startswith(("WARNING", "ERROR"))]
    assert not warnings, "\n".join(warnings)
    pages = sorted(p.relative_to(DOCS).with_suffix(".html") for p in DOCS.glob("*.md"))
    assert all((site / p).is_file() for p in pages), [str(p) for p in pages if not (site / p).is_file()]
    # Offline: the built-in theme, no stylesheet, script or font from the web.
    for html in site.rglob("*.html"):
        for tag in re.findall(r"<(?:link|script)\b[^>]*>", html.read_text(encoding="utf-8")):
            assert not re.search(r"""(?:href|src)\s*=\s*["']?(?:https?:)?//""", tag), f"{html.name}: {tag}"
    for css in site.rglob("*.css"):
        assert not re.search(r"""url\(\s*["']?(?:https?:)?//|@import\s+["']?(?:url\()?\s*["']?(?:https?:)?//""",
                             css.read_text(encoding="utf-8", errors="replace")), css.name


def test_readme_is_short():
    n = len(README.read_text(encoding="utf-8").splitlines())
    assert n <= README_MAX_LINES, (f"README.md has {n} lines; it is for a newcomer (at most {README_MAX_LINES}): "
                                   "move reference material into docs/")


def test_readme_starts_with_its_two_commands():
    text = README.read_text(encoding="utf-8")
    first = _FENCE.search(text)
    assert first, "README.md has no code block"
    commands = [line.split("#")[0].strip() for line in first.group(0).splitlines()[1:-1]]
    assert [c for c in commands if c] == ["make report", "make test"], first.group(0)


@pytest.mark.parametrize("page", _pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_point_at_files(page):
    broken = []
    for target in _relative_links(page.read_text(encoding="utf-8")):
        path = target.split("#")[0].split("?")[0]
        if path and not (page.parent / path).resolve().exists():
            broken.append(target)
    assert not broken, f"{page.relative_to(ROOT)}: links to missing files: {broken}"


def test_link_finder_sees_links_and_skips_code():
    text = ("See [a](docs/a.md#x), [b][ref] and [web](https://example.org).\n\n[ref]: docs/b.md\n\n"
            "`[c](not-a-link.md)`\n\n```python\nx = [d](e)\n```\n[top](#top)\n")
    assert _relative_links(text) == ["docs/a.md#x", "docs/b.md"]


def test_api_page_names_every_public_name():
    import headscope

    page = (DOCS / "api.md").read_text(encoding="utf-8")
    missing = [name for name, home in headscope._HOMES.items()
               if not re.search(rf"\b{re.escape(home[1] if isinstance(home, tuple) else name)}\b", page)]
    assert not missing, f"docs/api.md does not document {missing} (add them to their home module's block)"


def test_heads_page_names_every_metric():
    from headscope.analyses.metrics import METRICS

    page = (DOCS / "heads.md").read_text(encoding="utf-8")
    missing = [m for m in METRICS if f"`{m}`" not in page]
    assert not missing, f"docs/heads.md's metric table lacks {missing} (analyses/metrics.py registers them)"
