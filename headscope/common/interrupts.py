"""Ctrl-C that cannot be lost: every command runs inside one `Interrupts` guard (`headscope.cli`)."""

from __future__ import annotations

import signal
import sys
from typing import Any, Callable

import click

__all__ = ["Interrupts", "committed"]


class Interrupts:
    """Ctrl-C that cannot be lost: SIGINT raises KeyboardInterrupt as usual and is also remembered.

    A KeyboardInterrupt raised while Python runs a finaliser (a `__del__`, a weakref callback) would
    be printed as "Exception ignored ... KeyboardInterrupt:" and dropped, and the run would go on;
    `check()` raises it again at the next safe point (and the dropped one is not printed). Used as a
    context manager in the main thread; the previous handler is restored on exit. Every command runs
    inside one (`headscope.cli`, which checks it when the command returns); a guard opened inside
    another (`run`'s, for its own safe points) marks the outer one too.

    `commit(what)` says the command's output is in place: from then on a Ctrl-C is too late to undo
    anything, so it is remembered as `late` (announced by `headscope.cli`, exit status unchanged)
    instead of raised. Never both: an interrupt either stops the command before its output replaces
    anything (130), or comes after and is only announced.
    """

    def __init__(self) -> None:
        self.received = False
        self.committed: str | None = None  # what is in place, once the output is
        self.late = False  # a Ctrl-C came after `commit`
        self._previous: Any = None
        self._hook: Any = None

    def __enter__(self) -> "Interrupts":
        import threading

        if threading.current_thread() is threading.main_thread():  # only there can Python take a signal
            self._previous = signal.signal(signal.SIGINT, self._handler)
            self._hook, sys.unraisablehook = sys.unraisablehook, self._unraisable
        return self

    def __exit__(self, *exc) -> None:
        if self._previous is not None:
            if signal.getsignal(signal.SIGINT) == self._handler:  # not one that was installed after it
                signal.signal(signal.SIGINT, self._previous)
            sys.unraisablehook = self._hook

    def _outer(self) -> "Interrupts | None":
        outer = getattr(self._previous, "__self__", None)
        return outer if isinstance(outer, Interrupts) else None

    def _mark(self) -> None:
        self.received = True
        if (outer := self._outer()) is not None:
            outer._mark()

    def _mark_late(self) -> None:
        self.late = True
        if (outer := self._outer()) is not None:
            outer._mark_late()

    def _handler(self, signum, frame) -> None:
        if self.committed is not None:
            self._mark_late()  # the output is in place: nothing left to stop
            return
        self._mark()
        raise KeyboardInterrupt

    def _unraisable(self, unraisable) -> None:
        if isinstance(unraisable.exc_value, KeyboardInterrupt) and self.received:
            return  # remembered: check() raises it where it can stop the command
        self._hook(unraisable)

    def commit(self, what: str) -> None:
        """`what` (a path, say) is in place: later Ctrl-Cs are announced, not raised (here and outside)."""
        if self.committed is None:
            self.committed = what
        if (outer := self._outer()) is not None:
            outer.commit(what)

    def check(self) -> None:
        """Raise KeyboardInterrupt if a Ctrl-C came in, even one that a finaliser swallowed."""
        if self.received:
            raise KeyboardInterrupt


def committed(what: str) -> Callable[[], None]:
    """The cue a writer gives once `what` is in place: it commits the running command's `Interrupts`
    (`headscope.cli` keeps it as the click context's object), so a later Ctrl-C is announced, not
    turned into "nothing was written" (130). Outside a command, a cue that does nothing."""
    ctx = click.get_current_context(silent=True)
    guard = ctx.find_object(Interrupts) if ctx is not None else None
    return (lambda: guard.commit(what)) if guard is not None else (lambda: None)
