"""The examples in docstrings run as tests, imported under the installed `headscope.` names.

pytest's `--doctest-modules` would import `probe/extract.py` as a top-level `probe` package (its
folder sits at the repository root), a second copy beside `headscope.probe`; running doctest on
the namespaced modules keeps one copy of every class.
"""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import headscope


# Installed from folders outside headscope/ (pyproject's package-dir), so a walk of headscope/ alone
# does not reach them.
_MAPPED = ("headscope.probe", "headscope.analyses", "headscope.reports")


def _modules() -> list[str]:
    names = {m.name for m in pkgutil.walk_packages(headscope.__path__, "headscope.")}
    for package in _MAPPED:
        names.add(package)
        names |= {m.name for m in pkgutil.walk_packages(importlib.import_module(package).__path__, package + ".")}
    finder = doctest.DocTestFinder()
    return sorted(n for n in names if any(t.examples for t in finder.find(importlib.import_module(n))))


MODULES = _modules()


def test_the_namespaced_subpackages_are_walked():
    for part in ("probe", "analyses", "reports"):
        assert any(m.startswith(f"headscope.{part}.") for m in MODULES), part


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    result = doctest.testmod(importlib.import_module(name), report=True)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples failed in {name}"
