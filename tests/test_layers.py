"""Arrows point one way: probe -> analyses -> reports. Every import in probe/ and analyses/, including
imports inside functions, is read from the source (ast), so a lazy upward import fails here too."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FORBIDDEN = {
    "probe": ("headscope.analyses", "headscope.reports", "analyses", "reports"),
    "analyses": ("headscope.reports", "reports"),
}


def _imports(path: Path, package: str, root: Path) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in the file, relative ones resolved."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            out.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # from ..reports import x, from . import y (inside headscope.<package>)
                parts = ["headscope", package, *path.relative_to(root / package).parent.parts]
                base = parts[: len(parts) - (node.level - 1)]
                name = ".".join(base + ([node.module] if node.module else []))
                out.extend((node.lineno, f"{name}.{alias.name}") for alias in node.names)
            else:
                out.append((node.lineno, node.module or ""))
                out.extend((node.lineno, f"{node.module}.{alias.name}") for alias in node.names)
    return out


def _violations(package: str, root: Path = ROOT) -> list[str]:
    bad = []
    for path in sorted((root / package).rglob("*.py")):
        for line, name in _imports(path, package, root):
            if any(name == f or name.startswith(f + ".") for f in FORBIDDEN[package]):
                bad.append(f"{path.relative_to(root)}:{line} imports {name}")
    return bad


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_no_upward_imports(package):
    assert _violations(package) == []


def test_the_check_sees_imports_inside_functions(tmp_path):
    fake = tmp_path / "probe"
    fake.mkdir()
    (fake / "types.py").write_text("def plot(self):\n    from headscope.reports.figures import f\n    return f\n"
                                   "def other():\n    from ..analyses import heads\n")
    assert _violations("probe", tmp_path) == ["probe/types.py:2 imports headscope.reports.figures",
                                    "probe/types.py:2 imports headscope.reports.figures.f",
                                    "probe/types.py:5 imports headscope.analyses.heads"]
