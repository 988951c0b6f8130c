"""Ctrl-C that cannot be lost: every command runs inside one `Interrupts` guard (`headscope.cli`)."""

from __future__ import annotations

import signal
import sys
from typing import Any

__all__ = ["Interrupts"]


class Interrupts:
    """Ctrl-C that cannot be lost: SIGINT raises KeyboardInterrupt as usual and is also remembered.

    A KeyboardInterrupt raised while Python runs a finaliser (a `__del__`, a weakref callback) would
    be printed as "Exception ignored ... KeyboardInterrupt:" and dropped, and the run would go on;
    `check()` raises it again at the next safe point (and the dropped one is not printed). Used as a
    context manager in the main thread; the previous handler is restored on exit. Every command runs
    inside one (`headscope.cli`, which checks it when the command returns); a guard opened inside
    another (`run`'s, for its own safe points) marks the outer one too.
    """

    def __init__(self) -> None:
        self.received = False
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
            signal.signal(signal.SIGINT, self._previous)
            sys.unraisablehook = self._hook

    def _mark(self) -> None:
        self.received = True
        outer = getattr(self._previous, "__self__", None)
        if isinstance(outer, Interrupts):
            outer._mark()

    def _handler(self, signum, frame) -> None:
        self._mark()
        raise KeyboardInterrupt

    def _unraisable(self, unraisable) -> None:
        if isinstance(unraisable.exc_value, KeyboardInterrupt) and self.received:
            return  # remembered: check() raises it where it can stop the command
        self._hook(unraisable)

    def check(self) -> None:
        """Raise KeyboardInterrupt if a Ctrl-C came in, even one that a finaliser swallowed."""
        if self.received:
            raise KeyboardInterrupt
