"""The report as a library call: `report(analyses, out)` writes one folder, whole or not at all.

    out/index.html        the page (`reports.html.build_report`: SECTIONS, FIGURES, the explorer)
    out/figures/*.png     every figure (and .svg / .pdf when asked for)
    out/<table>.csv       every section's tables, models stacked
    out/run.json          what was run: settings, versions, each model's `ModelAnalysis.to_dict()`,
                          the files above (so that a later `force=True` knows the folder is a report)

The folder is written through `probe.folders.write_folder`: into a temporary sibling renamed into
place, so an interrupted write leaves no half report. An existing `out` is replaced only with
`force=True`, and only when headscope wrote it (`not_a_report`) or it is empty. `headscope run` and
`headscope compare --report` both call `report`.
"""

from __future__ import annotations

import json
import os
import platform
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from headscope.probe.folders import writable, write_folder
from headscope.probe.types import json_safe

from .analysis import ModelAnalysis
from .canvas import check_width
from .drawing import DrawingPool
from .html import build_report

__all__ = ["report", "ReportFolder", "ReportFolderError", "check_report_folder", "not_a_report", "versions"]

_VERSIONED = ("headscope", "torch", "transformers", "numpy", "pandas", "matplotlib", "seaborn", "jinja2", "gguf")


class ReportFolderError(ValueError):
    """The report folder cannot be written or must not be replaced (the message says why and what to do)."""


@dataclass(frozen=True)
class ReportFolder:
    """A written report: its folder, how many figures it draws, its files' names, and its run.json record."""

    path: Path
    n_figures: int
    figures: tuple[str, ...]  # figures/<name>, one per figure and format
    tables: tuple[str, ...]  # <table>.csv
    record: Mapping[str, Any]

    @property
    def size(self) -> int:
        """Bytes of index.html."""
        return (self.path / "index.html").stat().st_size


def versions() -> dict:
    """Versions of everything that shapes the numbers (None for a package that is not installed)."""
    out: dict[str, Any] = {}
    for dist in _VERSIONED:
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
        if dist == "headscope":
            out.update(python=platform.python_version(), platform=platform.platform())
    return out


def check_report_folder(out: Path, *, force: bool, option: str = "out") -> None:
    """Refuse, before any work, a report folder that must not be replaced or cannot be written
    (`ReportFolderError`, naming `option`)."""
    out = Path(out)
    problem = writable(out)  # first: a name too long for the file system cannot even be looked at
    if problem:
        raise ReportFolderError(f"{option} {out}: {problem}")
    here, target = Path.cwd().resolve(), out.resolve()
    if target == here or target in here.parents:
        raise ReportFolderError(f"{option} {out} is the working directory or a folder above it; give a new folder "
                                "for the report")
    if out.is_symlink():
        raise ReportFolderError(f"{option} {out} is a symbolic link (to {os.readlink(out)}); headscope does not "
                                "write a report through a link: give the folder itself or a new name")
    if out.exists() and not out.is_dir():
        raise ReportFolderError(f"{option} {out} exists and is not a folder; remove it or choose another name")
    if out.exists() and not force:
        raise ReportFolderError(f"{option} {out} already exists; pass --force to replace it, or choose another folder")
    if out.exists():
        problem = not_a_report(out)
        if problem:
            raise ReportFolderError(f"{option} {out}: {problem}; --force replaces only a report folder that "
                                    "headscope wrote")


def not_a_report(folder: Path) -> str | None:
    """Why `folder` is not a report folder that `force` may replace, or None (a report, or empty).

    A report is recognised by its run.json, which lists the report's files: anything else in the
    folder (a file the user added, another project) makes it not replaceable.
    """
    folder = Path(folder)
    if not any(folder.iterdir()):
        return None
    try:
        record = json.loads((folder / "run.json").read_text(encoding="utf-8"))
    except FileNotFoundError:
        return "the folder has no run.json, so headscope did not write it"
    except (OSError, ValueError):
        return "its run.json is not a headscope run record"
    files = record.get("files") if isinstance(record, dict) else None
    if not isinstance(files, dict) or "headscope" not in record:
        return "its run.json is not a headscope run record"
    ours = {"run.json", "figures", str(files.get("report")), *map(str, files.get("figures", ())),
            *map(str, files.get("tables", ()))}
    for path in sorted(folder.rglob("*")):
        name = path.relative_to(folder).as_posix()
        if name not in ours or (name == "figures") != (path.is_dir() and not path.is_symlink()):
            return f"it holds {name}, which headscope did not write"
    return None


def report(analyses: Sequence[ModelAnalysis], out: str | Path, *, force: bool = False, title: str | None = None,
           settings: Mapping[str, Any] | None = None, record: Mapping[str, Any] | None = None,
           formats: Sequence[str] = ("png",), dpi: int = 100, width: float | None = None,
           check: Callable[[], None] = lambda: None, committed: Callable[[], None] = lambda: None,
           started: float | None = None, workers: int | None = None, pool: DrawingPool | None = None) -> ReportFolder:
    """Write the report of `analyses` (one `ModelAnalysis` per model, side by side) into the folder `out`.

    `settings` are shown on the page and recorded in run.json; `record` adds (or overrides) run.json
    keys (`headscope run` records its sentences there, `compare` its comparison). `formats`, `dpi`
    and `width` (inches) shape the figure files, drawn on `workers` processes (default: one per core, or the
    calling process alone where a spawned worker would run the caller's script again; `reports.drawing.draw_all`), or on a `reports.drawing.DrawingPool` already started and this process. `check()` runs before anything is moved (an
    interrupt check), `committed()` the moment the new folder is in place (`write_folder`); `started` (a `time.perf_counter()` value) dates `seconds.total` in run.json.
    `ReportFolderError` when `out` must not be replaced; an interrupted or failed write leaves `out`
    as it was.

    >>> from headscope.probe.tiny import tiny_model                      # doctest: +SKIP
    >>> import headscope as hs                                           # doctest: +SKIP
    >>> a = hs.analyse_model(tiny_model("bert"), hs.builtin_corpus()[:8], [], hs.RunSettings(...))  # doctest: +SKIP
    >>> hs.report([a], "my-report").path                                 # doctest: +SKIP
    """
    out = Path(out)
    started = time.perf_counter() if started is None else started
    check_width(width, dpi)
    check_report_folder(out, force=force)
    t0 = time.perf_counter()
    the_versions = versions()
    page = build_report(analyses, title=title, settings=settings, versions=the_versions, dpi=dpi, formats=formats,
                        width=width, workers=workers, pool=pool)
    check()
    seconds_report = time.perf_counter() - t0
    figures = tuple(f"figures/{n}" for f in page.figures for n in f.written)
    tables = tuple(f"{t}.csv" for t in sorted(page.tables))
    run_record = {
        "headscope": the_versions["headscope"],
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "out": str(out),
        "passed": all(a.verified for a in analyses),
        "settings": dict(settings or {}),
        "versions": the_versions,
        "models": [a.to_dict() for a in analyses],
        "files": {"report": "index.html", "figures": list(figures), "tables": list(tables)},
        **(record or {}),
    }

    def fill(folder: Path) -> None:
        page.write(folder)
        run_record["seconds"] = {"report": round(seconds_report, 3), "total": round(time.perf_counter() - started, 3)}
        (folder / "run.json").write_text(json.dumps(json_safe(run_record), indent=2, ensure_ascii=False) + "\n",
                                         encoding="utf-8")

    write_folder(out, fill, replace=not_a_report if force else None, check=check, committed=committed)
    return ReportFolder(path=out, n_figures=len(page.figures), figures=figures, tables=tables, record=run_record)
