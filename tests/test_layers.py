"""Arrows point one way and never come back: probe -> analyses -> reports -> headscope (API, CLI) -> benchmarks,
and no import cycle between any two files.

Every `.py` of the rooms (probe/, analyses/, reports/), the top floor (headscope/, whose probe, analyses and
reports are links to the rooms and are not read twice), benchmarks/ and scripts/ is read from the source (ast).
Each import — absolute or relative, at the top or inside a function, `from package import submodule` counting
as an import of that submodule's file — is resolved to a file of the repository, giving a graph of files: a
lazy import that points upward or closes a loop fails here too. Benchmarks import each other as top-level
modules (`from common import ...`, their folder is on sys.path), so a bare name there is a sibling file.
A module imported by a computed name (`importlib.import_module`, headscope's lazy names) is not seen.
"""

from __future__ import annotations

import ast
import os
from dataclasses import dataclass
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parents[1]
ROOMS = ("probe", "analyses", "reports")  # installed as headscope.<room>
TOP_LEVEL_DIRS = ("benchmarks", "scripts")  # run as scripts: their own folder is on sys.path
# Lower layers never import higher ones. The top floor is headscope/ itself (API, CLI, commands).
LAYER = {"probe": 0, "analyses": 1, "reports": 2, "headscope": 3, "benchmarks": 4, "scripts": 4}
LAYER_NAME = {0: "probe", 1: "analyses", 2: "reports", 3: "the headscope top floor", 4: "benchmarks/scripts"}

@dataclass(frozen=True)
class Import:
    """One import of one file of the project, resolved: `source` imports `target` (paths relative to the root)."""

    source: str
    line: int
    name: str  # the module as written, made absolute
    target: str


def _py_files(folder: Path) -> list[Path]:
    """The `.py` files under `folder`, not descending into linked folders (headscope/probe -> ../probe)."""
    out = []
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=False):
        here = Path(dirpath)
        dirnames[:] = sorted(d for d in dirnames if not (here / d).is_symlink() and d != "__pycache__")
        out.extend(here / f for f in sorted(filenames) if f.endswith(".py") and not (here / f).is_symlink())
    return out


def _module_name(rel: Path) -> str:
    """The dotted name a file is imported as: probe/x.py -> headscope.probe.x, benchmarks/common.py -> common."""
    parts = list(rel.with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    if parts[0] in ROOMS:
        return ".".join(["headscope", *parts])
    if parts[0] in TOP_LEVEL_DIRS:
        return ".".join(parts[1:])
    return ".".join(parts)


def project_modules(root: Path = ROOT) -> dict[str, dict[str, str]]:
    """Per scope, module name -> file: scope "" holds the package (headscope.*), each top-level folder
    (benchmarks, scripts) its own bare names."""
    scopes: dict[str, dict[str, str]] = {"": {}}
    for top in (*ROOMS, "headscope", *TOP_LEVEL_DIRS):
        scope = top if top in TOP_LEVEL_DIRS else ""
        for path in _py_files(root / top) if (root / top).is_dir() else []:
            rel = path.relative_to(root)
            scopes.setdefault(scope, {})[_module_name(rel)] = rel.as_posix()
    return scopes


def _scope(rel: str) -> str:
    top = rel.split("/")[0]
    return top if top in TOP_LEVEL_DIRS else ""


def _resolve(name: str, scope: str, modules: dict[str, dict[str, str]]) -> str | None:
    """The file of module `name` seen from a file of `scope`; None for a module outside the project."""
    if name in modules.get(scope, {}):
        return modules[scope][name]
    if name.split(".")[0] in ROOMS:  # a bare room name (`from reports import x`) means the same file
        name = f"headscope.{name}"
    return modules[""].get(name)


def imports(rel: str, root: Path = ROOT, modules: dict[str, dict[str, str]] | None = None) -> list[Import]:
    """Every import of the file `rel` that lands on a file of the project, in source order."""
    modules = project_modules(root) if modules is None else modules
    scope, own = _scope(rel), _module_name(Path(rel))
    package = own if rel.endswith("__init__.py") else own.rpartition(".")[0]
    tree = ast.parse((root / rel).read_text(encoding="utf-8"), filename=rel)
    out: list[Import] = []

    def add(line: int, name: str) -> None:
        target = _resolve(name, scope, modules)
        if target is not None and target != rel:
            out.append(Import(rel, line, name, target))

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(node.lineno, alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # from . import y, from ..reports import x
                parts = package.split(".") if package else []
                base = parts[: len(parts) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            add(node.lineno, module)
            for alias in node.names:  # `from package import submodule` imports that submodule's file
                if alias.name != "*" and _resolve(f"{module}.{alias.name}", scope, modules) is not None:
                    add(node.lineno, f"{module}.{alias.name}")
    return sorted(out, key=lambda i: (i.line, i.target))


def import_graph(root: Path = ROOT) -> nx.DiGraph:
    """Files of the project, an edge a -> b where a imports b (each edge keeps its first `Import`)."""
    modules = project_modules(root)
    graph = nx.DiGraph()
    for scope in modules.values():
        for rel in scope.values():
            graph.add_node(rel)
            for imp in imports(rel, root, modules):
                if not graph.has_edge(rel, imp.target):
                    graph.add_edge(rel, imp.target, first=imp)
    return graph


def _layer(rel: str) -> int:
    return LAYER[rel.split("/")[0]]


def upward_imports(root: Path = ROOT) -> list[str]:
    """`file:line imports module (a higher layer)` for every import that points up the stack."""
    modules = project_modules(root)
    bad = []
    for scope in modules.values():
        for rel in sorted(scope.values()):
            for imp in imports(rel, root, modules):
                if _layer(imp.target) > _layer(rel):
                    bad.append(f"{rel}:{imp.line} imports {imp.name} ({LAYER_NAME[_layer(imp.target)]})")
    return bad


def import_cycles(root: Path = ROOT, allowed: frozenset[str] = frozenset()) -> list[str]:
    """Each cycle between files as `a.py -> b.py -> a.py` (starting at its smallest path), sorted; a cycle
    whose files all lie in `allowed` is left out."""
    graph = import_graph(root)
    found = []
    for cycle in nx.simple_cycles(graph):
        if set(cycle) <= allowed:
            continue
        start = cycle.index(min(cycle))
        cycle = cycle[start:] + cycle[:start]
        found.append(" -> ".join([*cycle, cycle[0]]))
    return sorted(found)


def test_no_upward_imports():
    bad = upward_imports()
    assert not bad, "imports that point up the stack:\n" + "\n".join(bad)


def test_no_import_cycle():
    cycles = import_cycles()
    assert not cycles, "import cycles between files:\n" + "\n".join(cycles)


def test_every_room_is_read():
    graph = import_graph()
    for top in (*ROOMS, "headscope", "benchmarks"):  # scripts/ holds no .py today
        assert any(n.startswith(f"{top}/") for n in graph), top
    assert not any(n.startswith(("headscope/probe/", "headscope/analyses/", "headscope/reports/")) for n in graph)
    # one known arrow of each kind: relative (two levels), absolute inside a function, `from package import
    # submodule`, a bare sibling name in benchmarks/
    assert graph.has_edge("probe/extract.py", "probe/types.py")
    assert graph.has_edge("headscope/commands/verify.py", "headscope/common/options.py")
    assert graph.has_edge("headscope/commands/verify.py", "headscope/__init__.py")
    assert graph.has_edge("benchmarks/ablation_numbers.py", "headscope/workflows/ablation.py")
    assert graph.has_edge("benchmarks/run.py", "benchmarks/common.py")


def _plant(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    (root / "headscope" / "probe").symlink_to("../probe", target_is_directory=True)
    return root


def test_the_check_sees_imports_inside_functions(tmp_path):
    root = _plant(tmp_path, {
        "headscope/__init__.py": "",
        "probe/__init__.py": "",
        "probe/types.py": "def plot(self):\n    from headscope.reports.figures import f\n    return f\n"
                          "def other():\n    from ..analyses import heads\n",
        "analyses/__init__.py": "",
        "analyses/heads.py": "",
        "reports/__init__.py": "",
        "reports/figures.py": "def f():\n    pass\n",
    })
    assert upward_imports(root) == ["probe/types.py:2 imports headscope.reports.figures (reports)",
                                    "probe/types.py:5 imports headscope.analyses (analyses)",
                                    "probe/types.py:5 imports headscope.analyses.heads (analyses)"]


def test_the_check_finds_a_planted_cycle(tmp_path):
    root = _plant(tmp_path, {
        "headscope/__init__.py": "from .api import run\n",
        "headscope/api.py": "def run():\n    from headscope.probe import extract\n",
        "probe/__init__.py": "",
        "probe/extract.py": "from .norms import norm\n",
        "probe/norms.py": "def norm():\n    from . import extract  # closes the loop from inside a function\n",
        "probe/types.py": "",
        "benchmarks/common.py": "import speed\n",
        "benchmarks/speed.py": "from common import x\nimport headscope\n",
    })
    assert import_cycles(root) == ["benchmarks/common.py -> benchmarks/speed.py -> benchmarks/common.py",
                                   "probe/extract.py -> probe/norms.py -> probe/extract.py"]
    # the linked headscope/probe is not read a second time: extract.py appears once, as probe/extract.py
    assert not any("headscope/probe" in n for n in import_graph(root))
    assert import_cycles(root, allowed=frozenset({"probe/extract.py", "probe/norms.py"})) == [
        "benchmarks/common.py -> benchmarks/speed.py -> benchmarks/common.py"]


# --- no module imports another module's private name ---------------------------------------------------



def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_imports(root: Path = ROOT) -> list[str]:
    """`file:line imports _name from other.py` for each private name of another project module that a module of
    the rooms or the top floor reads: `from .x import _y`, or `x._y` where `x` is a project module it imported."""
    modules = project_modules(root)
    found = []
    for rel in sorted(modules[""].values()):
        own = _module_name(Path(rel))
        package = own if rel.endswith("__init__.py") else own.rpartition(".")[0]
        tree = ast.parse((root / rel).read_text(encoding="utf-8"), filename=rel)
        imported: dict[str, str] = {}  # a local name bound to a project module -> the module's dotted name
        hits: list[tuple[int, str, str]] = []
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                parts = package.split(".") if package else []
                module = (".".join(parts[: len(parts) - (node.level - 1)] + ([node.module] if node.module else []))
                          if node.level else node.module or "")
                target = _resolve(module, "", modules)
                for alias in node.names:
                    if _resolve(f"{module}.{alias.name}", "", modules) is not None:  # a submodule
                        imported[alias.asname or alias.name] = f"{module}.{alias.name}"
                    elif target is not None and target != rel and _private(alias.name):
                        hits.append((node.lineno, alias.name, target))
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    local = alias.asname or alias.name.split(".")[0]
                    imported[local] = alias.name if alias.asname else local
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and _private(node.attr):
                target = _resolve(_dotted(node.value, imported) or "", "", modules)
                if target is not None and target != rel:
                    hits.append((node.lineno, node.attr, target))
        found += [f"{rel}:{line} imports {name} from {target}" for line, name, target in sorted(set(hits))]
    return found


def _dotted(node: ast.expr, imported: dict[str, str]) -> str | None:
    """`x.y.z` as the dotted module name it stands for when `x` names an imported module; else None."""
    if isinstance(node, ast.Name):
        return imported.get(node.id)
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value, imported)
        return None if base is None else f"{base}.{node.attr}"
    return None


def test_no_module_imports_another_modules_private_name():
    found = private_imports()
    assert not found, "private names read from another module (make them public in their home):\n" + "\n".join(found)


def test_the_private_name_check_sees_both_spellings(tmp_path):
    root = _plant(tmp_path, {
        "headscope/__init__.py": "",
        "probe/__init__.py": "",
        "probe/extract.py": "def _select():\n    pass\ndef own():\n    return _select()\n",
        "probe/recompute.py": "from .extract import _select\n",
        "probe/live.py": "from . import extract\ndef f():\n    return extract._select\n",
        "probe/sources.py": "import headscope.probe.extract as ex\nx = ex._select\nfrom .extract import __doc__\n",
        "probe/norms.py": "import headscope.probe.extract\ny = headscope.probe.extract._select\n",
    })
    assert private_imports(root) == ["probe/live.py:3 imports _select from probe/extract.py",
                                     "probe/norms.py:2 imports _select from probe/extract.py",
                                     "probe/recompute.py:1 imports _select from probe/extract.py",
                                     "probe/sources.py:2 imports _select from probe/extract.py"]


def test_no_file_of_probe_or_analyses_is_a_grab_bag():
    """Past 800 lines a file holds several ideas: split it, one idea per file."""
    long = [f"{p.relative_to(ROOT)}: {n} lines" for room in ("probe", "analyses") for p in _py_files(ROOT / room)
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > 800]
    assert not long, "files over 800 lines:\n" + "\n".join(long)
