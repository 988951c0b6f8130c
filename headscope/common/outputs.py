"""What a command writes: tables (`--out FILE`, by its suffix), report folders, JSON and lines on the terminal.

Every output is checked before any model loads: an existing file is refused unless `--force`, the folder
it goes into must take a new file (missing parent folders are created when the output is written, never
before), and two outputs of one command may not name the same file. A table is written to a temporary
file beside its name and renamed over it when complete.
"""

from __future__ import annotations

import json
import os
from contextlib import suppress
from pathlib import Path
from typing import Any, Callable

import click

from .exits import fail
from .interrupts import committed

__all__ = ["emit", "write_outputs", "TABLE_WRITERS", "forced", "check_report_dir", "write_table", "check_maps_path", "writable_or_fail", "new_file_or_fail", "claim_output", "check_table_path",
           "remember_force", "new_figure_or_fail", "check_out", "echo_json", "say", "attention_note"]


def _write_csv(table, path: Path) -> None:
    table.to_csv(path, index=False)


def _write_parquet(table, path: Path) -> None:
    table.to_parquet(path, index=False)


def _write_json(table, path: Path) -> None:
    from headscope.probe.types import json_safe

    rows = json_safe(table.to_dict(orient="records"))
    path.write_text(json.dumps(rows, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


# A table's file format, by the suffix of --out.
TABLE_WRITERS: dict[str, Callable[[Any, Path], None]] = {
    ".csv": _write_csv,
    ".parquet": _write_parquet,
    ".json": _write_json,
}


_FORCE = "headscope.force"  # ctx.meta key: --force, read by --out's check


def remember_force(ctx, param, value: bool) -> bool:
    """The click callback of `--force` (eager): it is read before `--out` is checked."""
    ctx.meta[_FORCE] = value
    return value


def forced() -> bool:
    """Whether `--force` was given to the running command (`options.force`)."""
    ctx = click.get_current_context(silent=True)
    return bool(ctx is not None and ctx.meta.get(_FORCE, False))


def check_report_dir(ctx, param, value: Path | None) -> Path | None:
    """The click callback of `--report DIR` (and of run's old `--out DIR`): a report folder, checked before any model
    loads (`check_out`), --force read first."""
    if value is not None:
        check_out(value, ctx.meta.get(_FORCE, False), param.opts[0])
    return value


def check_table_path(ctx, param, value: Path | None) -> Path | None:
    """The click callback of `--out FILE`: a table's name, checked before any compute."""
    if value is None:
        return None
    if value.suffix not in TABLE_WRITERS:
        fail(f"--out {value}: use a {', '.join(TABLE_WRITERS)} file name")
    writable_or_fail(value, "--out")  # first: a name too long for the file system cannot even be looked at
    if value.is_dir():
        fail(f"--out {value} is a folder; give a file name ending in {', '.join(TABLE_WRITERS)}")
    new_file_or_fail(value, "--out")
    return value


def check_maps_path(ctx, param, value: Path | None) -> Path | None:
    """The click callback of `headscope extract --out FILE`: an attention-maps file (`probe.mapfiles`), checked
    before any model loads. An existing file is replaced only with --force and only when headscope wrote it;
    a format whose library is missing (pyarrow for .parquet) is refused now, not after the compute."""
    if value is None:
        return None
    from importlib.util import find_spec

    from headscope.probe.mapfiles import check_target

    writable_or_fail(value, "--out")  # first: a name too long for the file system cannot even be looked at
    try:
        fmt = check_target(value, force=ctx.meta.get(_FORCE, False))
    except ValueError as exc:
        fail(f"--out {exc}")
    if fmt.needs and find_spec(fmt.needs) is None:
        fail(f"--out {value}: a {fmt.suffix} file needs {fmt.needs} (pip install {fmt.needs}); or write "
             ".safetensors or .npz")
    claim_output(value, "--out", folder=False)
    return value


def new_file_or_fail(path: Path, option: str, *, replaceable: bool = True) -> None:
    """Refuse, before any compute, an output file that exists (unless --force was given and the option's files
    are `replaceable`), cannot be written, is a symbolic link, or is another output of the same command."""
    writable_or_fail(path, option)  # first: a name too long for the file system cannot even be looked at
    if path.is_symlink():
        fail(f"{option} {path} is a symbolic link (to {os.readlink(path)}); headscope does not write through links: "
             "give the file itself or a new name")
    if path.is_dir():
        fail(f"{option} {path} is a folder; give a file name")
    claim_output(path, option, folder=False)
    if path.exists() and not replaceable:
        fail(f"{option} {path} exists; choose another file (headscope never replaces a file it did not write)")
    if path.exists() and not click.get_current_context().meta.get(_FORCE, False):
        fail(f"{option} {path} already exists; pass --force to replace it, or choose another file")


def new_figure_or_fail(ctx, param, value: str | None) -> str | None:
    """The click callback of `--figure FILE`: a figure never replaces a file, and what would fail only after the
    compute fails now (a suffix that is no figure format, a folder that cannot be written, a symbolic link)."""
    if value is None:
        return value
    from headscope.reports.canvas import FORMATS

    path = Path(value)
    if path.suffix.lower().lstrip(".") not in FORMATS:  # was "unexpected ValueError" once the model had run
        fail(f"--figure {value}: give a file name ending in {', '.join('.' + f for f in FORMATS)}")
    new_file_or_fail(path, "--figure", replaceable=False)
    return value


_OUTPUTS = "headscope.outputs"  # ctx.meta key: {resolved path: (option, is a folder)}, every output claimed so far


def claim_output(path: Path, option: str, *, folder: bool) -> None:
    """Fail when `path` is (or, for a file, lies inside) an output that another option of this command writes."""
    ctx = click.get_current_context(silent=True)
    if ctx is None:
        return
    claimed = ctx.find_root().meta.setdefault(_OUTPUTS, {})
    here = Path(os.path.realpath(path))
    for other, (other_option, other_folder) in claimed.items():
        if other_option == option:
            continue
        if other == here or (other_folder and other in here.parents) or (folder and here in other.parents):
            fail(f"{option} {path} and {other_option} name the same {'folder' if folder or other_folder else 'file'}; "
                 "two outputs of one command may not overwrite each other: give each its own name")
    claimed[here] = (option, folder)


def writable_or_fail(target: Path, option: str) -> None:
    """Fail now, before any compute, when `target` could not be written.

    Its nearest existing folder must take a new file: an anonymous temporary file is made there and
    removed at once, so the check leaves nothing behind (missing folders are created later, by the
    writer).
    """
    from headscope.probe.folders import writable

    problem = writable(target)
    if problem:
        fail(f"{option} {target}: {problem}")


def write_whole(path: Path, write: Callable[[Path], None]) -> None:
    """`write(tmp)` into a temporary file beside `path`, then renamed over it: a replaced file is never half
    written, and an interrupted one leaves nothing. Missing folders are created; a failure is one error line.
    Once the file is in place, a Ctrl-C is too late to undo it (`committed`)."""
    path = Path(path)
    tmp: Path | None = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # Named here but created by the writer, so the file gets the user's umask (mkstemp would make it 0600).
        tmp = path.with_name(f".{path.name}.partial-{os.getpid()}-{os.urandom(4).hex()}{path.suffix}")
        write(tmp)
        os.replace(tmp, path)
        tmp = None
        committed(str(path))()
    except (OSError, ImportError) as exc:
        fail(f"could not write {path}: {getattr(exc, 'strerror', None) or exc}")
    finally:
        if tmp is not None:
            with suppress(OSError):
                tmp.unlink()


def write_table(table, path: Path) -> None:
    """Write a DataFrame to `path` in the format its suffix names (`write_whole`)."""
    write_whole(path, lambda tmp: TABLE_WRITERS[Path(path).suffix](table, tmp))


def write_figure(figure, path: Path) -> None:
    """Write a matplotlib figure to `path` as the format its suffix names (`reports.canvas.save`, `write_whole`)."""
    from headscope.reports.canvas import save

    write_whole(path, lambda tmp: save(figure, tmp))


def write_outputs(result: Any, out_path: Path | None, figure_path: Path | str | None = None, *, table: Any = None,
                  **figure: Any) -> None:
    """A result command's files: its table (`result.to_frame()` unless `table` is given) to `--out`, its figure
    (`hs.plot(result, **figure)`) to `--figure`, each when asked for."""
    if out_path:
        write_table(result.to_frame() if table is None else table, Path(out_path))
    if figure_path is not None:
        from headscope.reports.figures import plot

        write_figure(plot(result, **figure), Path(figure_path))


def emit(result: Any, out_path: Path | None = None, figure_path: Path | str | None = None, *, as_json: bool,
         payload: Any = None, table: Any = None, summary: bool | str | None = True, **figure: Any) -> bool:
    """A command's whole output, the one writer every command uses: its files (`write_outputs`: the table
    `result.to_frame()`, or `table`, to --out; `hs.plot(result, **figure)` to --figure), then --json's object
    (`result.to_dict()`, or `payload`) or the text's first line (`result.summary()`, the string `summary`, or none
    for None). True for text, after which the command prints its own rows."""
    write_outputs(result, out_path, figure_path, table=table, **figure)
    if as_json:
        echo_json(result.to_dict() if payload is None else payload)
        return False
    if summary:
        click.echo(result.summary() if summary is True else summary)
    return True


def check_out(out: Path, force: bool, option: str = "--out") -> None:
    """Refuse, before any work, a report folder (`option`) that must not be replaced or cannot be written."""
    from headscope.reports.folder import ReportFolderError, check_report_folder

    try:
        check_report_folder(out, force=force, option=option)
    except ReportFolderError as exc:
        fail(str(exc))
    claim_output(out, option, folder=True)


def echo_json(obj: Any) -> None:
    """Strict JSON on stdout (NaN/inf as null), the same cleaning as the report's data block."""
    from headscope.probe.types import json_safe

    click.echo(json.dumps(json_safe(obj), indent=2, ensure_ascii=False))


def say(message: str, *, quiet: bool) -> None:
    """A progress line on stderr, unless --quiet."""
    if not quiet:
        click.echo(message, err=True)


def attention_note(meta: dict) -> str | None:
    """One line on how attention was obtained, for text output; None for a plain eager run."""
    how = meta.get("attention")
    if not how:
        return None
    from headscope.probe.wording import counted

    line = (f"attention: {how['recompute']} of {counted(how['eager'] + how['recompute'], 'text')} recomputed in blocks "
            f"(--attention {how['asked']}, budget {how['budget'] / 1e9:.2f} GB)")
    check = meta.get("check")
    return f"{line}; {check['summary']}" if check else line
