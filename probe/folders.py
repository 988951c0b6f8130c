"""Folders written whole or not at all: the one home of "temporary sibling, lock, rename, reclaim".

    write_folder(target, fill)     fill(tmp) a fresh `.<name>.partial-<token>` beside `target`, then rename it
                                   to `target`; an existing target moves aside to `.<name>.old-<token>` first
                                   (only when `replace(target)` finds nothing against it) and is deleted once
                                   the new folder is in place, or moved back if anything fails
    writable(target)               why a file or folder could not be created there, or None
    reclaim_stale(parent, name)    remove what killed writers left in `parent`: temporaries whose lock
                                   (`.<name>.partial-<token>.lock`) nobody holds; a moved-aside old folder
                                   goes back to its place when that place is empty

While it works a writer holds its own lock file, so a cleaner never touches a live writer's
temporaries; the operating system drops the lock when the writer dies. The report folder
(`reports.folder`) and the GGUF conversion cache (`probe.loading`) are both written this way.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable

from filelock import FileLock, Timeout

__all__ = ["write_folder", "reclaim_stale", "writable", "temporary_name", "PARTIAL", "OLD"]

PARTIAL = ".partial-"  # `.<name>.partial-<token>`: a folder being written
OLD = ".old-"  # `.<name>.old-<token>`: the folder it replaces, until the new one is in place


def temporary_name(name: str, token: str, kind: str = PARTIAL) -> str:
    """The hidden sibling of a folder called `name` that a writer with `token` uses.

    >>> temporary_name("report", "12-ab"), temporary_name("report", "12-ab", OLD)
    ('.report.partial-12-ab', '.report.old-12-ab')
    """
    return f".{name}{kind}{token}"


def write_folder(target: Path, fill: Callable[[Path], None], *, replace: Callable[[Path], str | None] | None = None,
                 check: Callable[[], None] = lambda: None) -> None:
    """Call `fill(tmp)` on a fresh temporary folder beside `target`, then move it to `target`.

    An exception or interrupt removes the temporary folder and leaves `target` as it was. An existing
    `target` is replaced only when `replace` is given and `replace(target)` returns None (else its
    answer says why not, in a `FileExistsError`); it is moved aside first and deleted only after the new
    folder is in place. `check()` runs just before anything is moved (an interrupt check, say).
    Temporaries of writers killed earlier are removed first (`reclaim_stale`).
    """
    target = Path(target).absolute()
    target.parent.mkdir(parents=True, exist_ok=True)
    reclaim_stale(target.parent, target.name)
    token = f"{os.getpid()}-{os.urandom(4).hex()}"
    tmp = target.with_name(temporary_name(target.name, token))
    old = target.with_name(temporary_name(target.name, token, OLD))
    lock = FileLock(_lock_of(tmp))
    try:
        with lock:  # taken before the folders exist, so a cleaner never sees them unlocked
            try:
                tmp.mkdir()
                fill(tmp)
                check()
                if target.exists():
                    problem = "it appeared while it was being written" if replace is None else replace(target)
                    if problem:
                        raise FileExistsError(f"{target}: {problem}; nothing was replaced")
                    os.replace(target, old)
                os.replace(tmp, target)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                if old.exists() and not target.exists():
                    os.replace(old, target)  # put the previous folder back
                raise
            finally:
                shutil.rmtree(old, ignore_errors=True)
    finally:
        _lock_of(tmp).unlink(missing_ok=True)


def reclaim_stale(parent: Path, name: str | None = None) -> None:
    """Remove the temporaries that killed writers of `parent / name` (of every folder in `parent` when
    `name` is None) left beside it: those whose lock is free.

    A killed writer's moved-aside previous folder (`.old-`) goes back to its place when that place is
    missing (the writer was killed between the two renames); otherwise it is deleted.
    """
    parent = Path(parent)
    for lock in sorted(parent.glob(f".{name if name is not None else '*'}{PARTIAL}*.lock")):
        tmp = lock.with_suffix("")
        owner, _, token = tmp.name[1:].rpartition(PARTIAL)
        target, old = parent / owner, parent / temporary_name(owner, token, OLD)
        try:
            with FileLock(lock, timeout=0):
                shutil.rmtree(tmp, ignore_errors=True)
                if old.exists() and not target.exists():
                    os.replace(old, target)
                shutil.rmtree(old, ignore_errors=True)
        except Timeout:
            continue  # a writer is working there right now
        lock.unlink(missing_ok=True)


def writable(target: Path) -> str | None:
    """Why a file or folder could not be created at `target`, or None: its nearest existing folder must
    take a new file (an anonymous temporary file is made there and removed at once)."""
    existing = Path(target).absolute().parent
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return f"{existing} is a file, not a folder"
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as exc:
        return f"cannot write in {existing} ({exc.strerror or exc})"
    return None


def _lock_of(tmp: Path) -> Path:
    return tmp.with_name(tmp.name + ".lock")
