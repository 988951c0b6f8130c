"""The documentation's code blocks run as tests (Sybil): every ```python, ```bash and ```console block of
README.md and docs/*.md, in page order, one namespace per page, as a reader would paste them.

- ```python: run in the page's namespace; a block that starts with `>>>` is a doctest whose shown output
  is compared (ELLIPSIS, NORMALIZE_WHITESPACE: numbers to the precision shown).
- ```bash: run by bash (-e -o pipefail) in the page's own temporary folder, `headscope` first on PATH; the
  block passes when it exits 0.
- ```console: `$ COMMAND` lines run like bash blocks; the lines under each are its shown stdout, compared
  as a doctest's output.
- ```text (and unlabelled fences) are shown, never run: synopses, diagrams, file listings.

Every page's folder holds a copy of examples/ (the sample inputs the pages name by that path) and, when
this machine has them, the public data sets under data/ (ud-english-ewt/, gap/): see `_data_source`.
`<!-- skip: next "REASON" -->` (Sybil's own directive) skips a block that needs a GPU, the hub, a network
or a server left running; `<!-- skip: next if(no_data("gap"), reason="...") -->` one that needs a data set.

Tiers: a page whose first lines hold `<!-- doc-tests: slow ... -->` (it loads real weights, or takes
minutes) is marked `docs_slow` and runs only with `--docs-slow` (`make test-docs`, which CI runs after
`make test`); every other page runs in `make test`.
"""

from __future__ import annotations

import doctest
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent
SLOW_PAGE = re.compile(r"^<!-- doc-tests: slow\b", re.M)
BLOCK_TIMEOUT_S = 1800
DATA_SETS = ("ud-english-ewt", "gap")
_FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


def _data_source() -> Path | None:
    """Where this machine keeps the public data sets, if it does: $HEADSCOPE_SHARED_DATA, else the folder
    the project's tests read beside the checkout."""
    for candidate in (os.environ.get("HEADSCOPE_SHARED_DATA"), ROOT.parent / "shared" / "data"):
        if candidate and Path(candidate).is_dir():
            return Path(candidate)
    return None


def _page_setup(namespace: dict) -> None:
    folder = Path(tempfile.mkdtemp(prefix="headscope-docs-"))
    shutil.copytree(ROOT / "examples", folder / "examples")
    source = _data_source()
    for name in DATA_SETS:
        if source is not None and (source / name).is_dir():
            (folder / "data").mkdir(exist_ok=True)
            (folder / "data" / name).symlink_to(source / name, target_is_directory=True)
    namespace["__docs_folder__"] = folder
    namespace["no_data"] = lambda name: not (folder / "data" / name).is_dir()


def _page_teardown(namespace: dict) -> None:
    folder = namespace.get("__docs_folder__")
    namespace.clear()
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)


@contextmanager
def _in(folder: Path):
    before = os.getcwd()
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(before)


def _env(folder: Path) -> dict:
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    env.setdefault("MPLBACKEND", "Agg")
    if (folder / "data").is_dir():
        env["HEADSCOPE_SHARED_DATA"] = str(folder / "data")
    return env


def _bash(script: str, folder: Path) -> subprocess.CompletedProcess:
    """The script's run; past BLOCK_TIMEOUT_S its whole process group is killed (the commands it started
    too, not only bash) and the run fails."""
    with subprocess.Popen(["bash", "-e", "-o", "pipefail", "-c", script], cwd=folder, env=_env(folder),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
                          start_new_session=True) as process:
        try:
            out, err = process.communicate(timeout=BLOCK_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            out, err = process.communicate()
            err += f"\n(killed after {BLOCK_TIMEOUT_S} s)"
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


def _failed(run: subprocess.CompletedProcess, what: str) -> str:
    return (f"{what} exited {run.returncode}\n--- stdout ---\n{run.stdout[-4000:]}\n"
            f"--- stderr ---\n{run.stderr[-4000:]}")


def evaluate_bash(example) -> str | None:
    run = _bash(str(example.parsed), example.namespace["__docs_folder__"])
    return _failed(run, "the block") if run.returncode else None


def _console_steps(source: str) -> list[tuple[str, str]]:
    """(command, shown output) pairs of a console transcript: `$ ` starts a command (a trailing backslash
    continues it on the next line), the lines up to the next `$ ` are its output."""
    steps: list[list[str]] = []
    continued = False
    for line in source.splitlines():
        if continued:
            steps[-1][0] += "\n" + line
        elif line.startswith("$ "):
            steps.append([line[2:], ""])
        elif steps:
            steps[-1][1] += line + "\n"
        else:
            raise ValueError(f"a console block must start with '$ ': {line!r}")
        continued = line.endswith("\\") and (continued or line.startswith("$ "))
    return [(c, o) for c, o in steps]


def evaluate_console(example) -> str | None:
    checker = doctest.OutputChecker()
    for command, shown in _console_steps(str(example.parsed)):
        run = _bash(command, example.namespace["__docs_folder__"])
        if run.returncode:
            return _failed(run, f"$ {command}")
        if not checker.check_output(shown, run.stdout, _FLAGS):
            return f"$ {command}\nshown:\n{shown}printed:\n{run.stdout}"
    return None


def _python_in_page_folder(evaluator):
    def evaluate(example):
        with _in(example.namespace["__docs_folder__"]):
            return evaluator(example)
    return evaluate


def _sybil():
    from sybil import Sybil
    from sybil.parsers.markdown import CodeBlockParser, PythonCodeBlockParser, SkipParser

    class PageFolderPythonParser(PythonCodeBlockParser):
        def __call__(self, document):
            for region in super().__call__(document):
                region.evaluator = _python_in_page_folder(region.evaluator)
                yield region

    return Sybil(parsers=[PageFolderPythonParser(doctest_optionflags=_FLAGS),
                          CodeBlockParser("bash", evaluate_bash), CodeBlockParser("console", evaluate_console),
                          SkipParser()],
                 patterns=["README.md", "docs/*.md"], setup=_page_setup, teardown=_page_teardown, name="docs")


pytest_collect_file = _sybil().pytest()


def pytest_addoption(parser):
    parser.addoption("--docs-slow", action="store_true",
                     help="also run the doc pages marked `<!-- doc-tests: slow -->` (make test-docs)")


def pytest_collection_modifyitems(config, items):
    slow_pages: dict[Path, bool] = {}
    kept, dropped = [], []
    for item in items:
        path = Path(str(item.path))
        if path.suffix == ".md":
            if path not in slow_pages:
                slow_pages[path] = bool(SLOW_PAGE.search("\n".join(path.read_text(encoding="utf-8").splitlines()[:5])))
            if slow_pages[path]:
                item.add_marker(pytest.mark.docs_slow)
                if not config.getoption("--docs-slow"):
                    dropped.append(item)
                    continue
        kept.append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept
