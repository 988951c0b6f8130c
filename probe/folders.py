"""Folders written whole or not at all: the one home of "temporary sibling, lock, rename, reclaim".

    write_folder(target, fill)     fill(tmp) a fresh `.<name>.partial-<token>` beside `target`, then rename it
                                   to `target`; an existing target moves aside to `.<name>.old-<token>` first
                                   (only when `replace(target)` finds nothing against it) and is deleted once
                                   the new folder is in place, or moved back if anything fails
    writable(target)               why a file or folder could not be created there, or None
    reclaim_stale(parent, name)    remove what killed writers left in `parent`: temporaries whose lock
                                   (`.<name>.partial-<token>.lock`) nobody holds or that has none; a
                                   moved-aside old folder goes back to its place when that place is empty

While it works a writer holds its own lock file, so a cleaner never touches a live writer's
temporaries; the operating system drops the lock when the writer dies. The report folder
(`reports.folder`) and the GGUF conversion cache (`probe.loading`) are both written this way.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import tempfile
import threading
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

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
                 check: Callable[[], None] = lambda: None, committed: Callable[[], None] = lambda: None) -> None:
    """Call `fill(tmp)` on a fresh temporary folder beside `target`, then move it to `target`.

    An exception or interrupt removes the temporary folder and leaves `target` as it was. An existing
    `target` is replaced only when `replace` is given and `replace(target)` returns None (else its
    answer says why not, in a `FileExistsError`); it is moved aside first and deleted only after the new
    folder is in place. `check()` runs just before anything is moved (an interrupt check, say).
    Temporaries of writers killed earlier are removed first (`reclaim_stale`). A symbolic link at
    `target` is refused (`FileExistsError`): the link would become a folder and its target stay.

    Once `check()` has passed, the replacement is one step: Ctrl-C (SIGINT) is held back until the new
    folder is in place and the old one gone, and then only announced (a "headscope: ..." warning),
    so an interrupt never leaves the new folder in place while saying that nothing was replaced.
    `committed()` is called the moment the new folder is in place, still with Ctrl-C held back: the
    caller's cue that from now on an interrupt is too late to undo anything (`headscope.cli` then
    announces one instead of exiting 130).
    """
    target = Path(target).absolute()
    if target.is_symlink():
        raise FileExistsError(f"{target} is a symbolic link; give the folder itself or a new name")
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
                with _interrupts_held() as interrupted:
                    if target.exists():
                        problem = "it appeared while it was being written" if replace is None else replace(target)
                        if problem:
                            raise FileExistsError(f"{target}: {problem}; nothing was replaced")
                        os.replace(target, old)
                    try:
                        os.replace(tmp, target)
                    except BaseException:
                        if old.exists() and not target.exists():
                            os.replace(old, target)  # put the previous folder back
                        raise
                    committed()
                    _remove(old)
            except BaseException:
                _remove(tmp)
                raise
            if interrupted():
                warnings.warn(f"headscope: Ctrl-C came while {target} was being replaced; the new folder was "
                              "already complete, so it is in place and the run finished", stacklevel=2)
    finally:
        _lock_of(tmp).unlink(missing_ok=True)


@contextmanager
def _interrupts_held() -> Iterator[Callable[[], bool]]:
    """SIGINT recorded instead of raised inside the block (main thread only); yields "did one come?"."""
    got: list[int] = []
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGINT) is None:
        yield lambda: False
        return
    previous = signal.signal(signal.SIGINT, lambda signum, frame: got.append(signum))
    try:
        yield lambda: bool(got)
    finally:
        signal.signal(signal.SIGINT, previous)


# `.<owner>.partial-<token>`, `.<owner>.old-<token>` and the lock `.<owner>.partial-<token>.lock`; the token is
# `<pid>-<hex>`, so the greedy owner keeps any ".partial-" of its own name.
_TEMPORARY = re.compile(rf"\.(?P<owner>.+)(?P<kind>{re.escape(PARTIAL)}|{re.escape(OLD)})(?P<token>[0-9]+-[0-9a-z]+)"
                        r"(?P<lock>\.lock)?")


def reclaim_stale(parent: Path, name: str | None = None) -> None:
    """Remove the temporaries that killed or interrupted writers of `parent / name` (of every folder in
    `parent` when `name` is None) left beside it: those whose lock is free or gone.

    A writer's moved-aside previous folder (`.old-`) goes back to its place when that place is missing
    (the writer was killed between the two renames); otherwise it is deleted. Only names of exactly
    this form, and of exactly this `name`, are touched: another folder's temporaries are never.
    """
    parent = Path(parent)
    writers: set[tuple[str, str]] = set()
    try:
        entries = list(parent.iterdir())
    except FileNotFoundError:
        return
    for entry in entries:
        m = _TEMPORARY.fullmatch(entry.name)
        if m and (name is None or m["owner"] == name):
            writers.add((m["owner"], m["token"]))
    for owner, token in sorted(writers):
        tmp = parent / temporary_name(owner, token)
        target, old, lock = parent / owner, parent / temporary_name(owner, token, OLD), _lock_of(tmp)
        try:
            with FileLock(lock, timeout=0):
                _remove(tmp)
                if (old.exists() or old.is_symlink()) and not (target.exists() or target.is_symlink()):
                    os.replace(old, target)
                _remove(old)
        except Timeout:
            continue  # a writer is working there right now
        lock.unlink(missing_ok=True)


NAME_MAX = 255  # bytes of one file name on the file systems headscope writes to (ext4, APFS, NTFS)
_ROOM = 40  # bytes a temporary sibling adds to a name: `.<name>.partial-<pid>-<hex>.lock`


def writable(target: Path) -> str | None:
    """Why a file or folder could not be created at `target`, or None: its name, with the room that a
    temporary sibling needs, and the names of the folders still to be made must fit a file name; its
    nearest existing folder must take a new file (an anonymous temporary file is made there and removed
    at once)."""
    target = Path(target).absolute()
    size = len(os.fsencode(target.name))
    if size > NAME_MAX - _ROOM:
        return (f"its name is {size} bytes; give a name of at most {NAME_MAX - _ROOM} bytes (a file name takes "
                f"{NAME_MAX}, and headscope writes a temporary beside it first)")
    existing = target.parent
    while not existing.exists() and existing != existing.parent:
        if len(os.fsencode(existing.name)) > NAME_MAX:
            return f"the folder name {existing.name[:40]}… is {len(os.fsencode(existing.name))} bytes; at most {NAME_MAX}"
        existing = existing.parent
    if not existing.is_dir():
        return f"{existing} is a file, not a folder"
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as exc:
        return f"cannot write in {existing} ({exc.strerror or exc})"
    return None


def _remove(path: Path) -> None:
    """Delete a temporary folder (or a link or file in its place); what cannot be deleted stays for the next
    `reclaim_stale`."""
    if path.is_symlink() or path.is_file():
        path.unlink(missing_ok=True)
    elif path.exists():
        shutil.rmtree(path, ignore_errors=True)


def _lock_of(tmp: Path) -> Path:
    return tmp.with_name(tmp.name + ".lock")
