"""Drawing the report's figures: each one's files from its spec and panel, on every core.

`draw(fn, args)` draws one figure of `reports.panels.FIGURES` (its spec's draw function) in this process and returns its files
(`Drawn`): the PNG, the page's 256-colour copy of it, and the other formats asked for. `draw_all(jobs)`
draws many: with several cores, worker processes (spawned: nothing of this process is shared, and it
works wherever Python runs) take figures from the front of the list while this process draws from the
back, so a pool that starts slowly never makes a report wait for it. A figure
is the same bytes whichever process draws it (each is drawn from its own arguments under matplotlib's
defaults, `reports.fonts.font_context`); a worker that fails to start or dies leaves its figures to this
process (as do figures whose function or arguments cannot be sent to another process), and an error while
drawing is raised here as in a serial run.

A spawned worker first imports the caller's `__main__` module again (as `__mp_main__`: multiprocessing's
spawn), which runs a script without an `if __name__ == "__main__":` guard a second time: its model loaded
again, its report written again. So a library call never starts workers on its own where that would happen
(`spawn_reruns_main`): `draw_all` without `workers` or a pool draws in this process then; a caller that
hands a pool (or asks for `workers`) started the workers itself (`headscope run` does, from a guarded entry).

A `DrawingPool` starts those workers ahead of time: `headscope run` opens one before it loads a model, so
the workers' imports (matplotlib, seaborn, torch for the maps) run beside the analyses on an idle core and
the report's figures start at once on every core. A warm pool's unfinished figure is waited for, not
drawn a second time here.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

__all__ = ["Drawn", "DrawingPool", "draw", "draw_all", "drawing_workers", "default_workers", "spawn_reruns_main",
           "compact_png", "PARALLEL_FROM"]

PARALLEL_FROM = 4  # jobs: fewer are drawn here (a worker would spend longer starting than drawing them)
WAIT_SECONDS = 300  # the longest a warm worker's figure is waited for before it is drawn here instead


@dataclass(frozen=True)
class Drawn:
    """One figure's files: `png` (full colour), `inline` (the page's copy), `files` (format -> bytes; {} = png only)."""

    png: bytes
    inline: bytes
    files: Mapping[str, bytes] = field(default_factory=dict)


def compact_png(png: bytes) -> bytes:
    """`png` with a 256-colour palette (no dithering), or `png` itself when that is not smaller."""
    import io

    from PIL import Image

    return _compact(Image.open(io.BytesIO(png)), png)


def _compact(image: Any, png: bytes) -> bytes:
    """The 256-colour copy of `image` (a PIL image of `png`'s pixels), or `png` when that is not smaller."""
    import io

    from PIL import Image

    buf = io.BytesIO()  # zlib's default level: level 9 (`optimize`) made files 9% smaller at 5× the time
    image.convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE).save(
        buf, format="PNG")
    return buf.getvalue() if buf.tell() < len(png) else png


def draw(fn: Callable[..., Any], args: tuple, *, dpi: int = 100, formats: Sequence[str] = ("png",),
         width: float | None = None) -> Drawn:
    """The figure `fn(*args)` (a `FigureSpec.draw` of `reports.panels.FIGURES`): its PNG at `dpi`, the page's
    copy, and the `formats` files (scaled to `width` inches) when more than the PNG is asked for."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from PIL import Image

    from .canvas import figure_bytes, to_png

    fig = fn(*args)
    canvas = FigureCanvasAgg(fig)  # the PNG is drawn on it, which keeps its pixels: the page's copy is made from them
    png = to_png(fig, dpi=dpi)
    pixels = canvas.buffer_rgba()  # the very pixels of `png` (not decoded again from it)
    inline = _compact(Image.frombuffer("RGBA", (pixels.shape[1], pixels.shape[0]), pixels, "raw", "RGBA", 0, 1), png)
    files = {} if tuple(formats) == ("png",) and width is None else {  # the PNG drawn once when unscaled
        fmt: png if fmt == "png" and width is None else figure_bytes(fig, fmt, dpi=dpi, width=width)
        for fmt in formats}
    return Drawn(png, inline, files)


def drawing_workers() -> int:
    """The cores this process may run on (its CPU affinity where the system tells it, else the CPU count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def spawn_reruns_main() -> bool:
    """Whether a spawned process would run this process's `__main__` module again: a script (`python
    snippet.py`) or a module run with `-m`, whose top-level code runs again in the worker unless it is
    guarded; not the interactive interpreter, `python -c`, or a package's `__main__` (which spawn skips).
    Asked of multiprocessing itself (`spawn.get_preparation_data`, what a worker is started with)."""
    from multiprocessing import spawn

    data = spawn.get_preparation_data("headscope-drawing")
    name = data.get("init_main_from_name")
    if name is not None:
        return not (name == "__main__" or name.endswith(".__main__"))
    return "init_main_from_path" in data


def default_workers() -> int:
    """The processes `draw_all` draws on when its caller names none: one per core (`drawing_workers`), or only
    this one where a worker would run the caller's script again (`spawn_reruns_main`)."""
    return 1 if spawn_reruns_main() else drawing_workers()


def _worker_start() -> None:
    """A pool's worker ignores Ctrl-C (the process that started it stops the run and closes the pool) and ends
    when that process is gone, even killed outright: it holds the ends of its own queues, so it would never
    see them close, and would outlive the run holding its output pipes. It waits on the parent's sentinel
    (ready once that process has ended), not on a timer."""
    import multiprocessing
    import signal
    import threading
    from multiprocessing.connection import wait

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    parent = multiprocessing.parent_process()
    if parent is None or parent.sentinel is None:  # not a spawned worker (nothing to watch)
        return

    def watch() -> None:
        wait([parent.sentinel])
        os._exit(0)

    threading.Thread(target=watch, name="headscope-parent-watch", daemon=True).start()


def _warm() -> None:
    """What a worker needs before its first figure: the drawing modules (torch, for the maps they take), the
    colour maps and the fonts."""
    import gc

    import seaborn  # noqa: F401  (the rocket / mako / vlag colour maps)
    from PIL import PngImagePlugin  # noqa: F401

    from . import panels  # noqa: F401  (every drawing function, and the results they draw)
    from .fonts import font_families

    font_families()
    gc.freeze()  # what is alive now lives to the end: the worker's exit, which the run waits for, skips it


class DrawingPool:
    """Worker processes for `draw_all`, started now so that they are ready when the figures are (`headscope run`
    opens one before it loads a model). `workers` counts this process too (default `drawing_workers()`: one
    per core), so `workers - 1` processes are spawned, none for 1. Use it as a context manager (or `close()`)."""

    def __init__(self, workers: int | None = None) -> None:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        self.workers = max(1, drawing_workers() if workers is None else workers)
        self.executor = None if self.workers == 1 else ProcessPoolExecutor(
            max_workers=self.workers - 1, mp_context=multiprocessing.get_context("spawn"), initializer=_worker_start)
        self._warming = [self.executor.submit(_warm) for _ in range(self.workers - 1)] if self.executor else []

    @property
    def warm(self) -> bool:
        """Whether every worker has started and imported what it draws with (a failed start counts as not)."""
        return all(f.done() and not f.cancelled() and f.exception() is None for f in self._warming)

    def close(self) -> None:
        """Stop the workers (a figure still being drawn in one is not waited for)."""
        if self.executor is not None:
            self.executor.shutdown(wait=False, cancel_futures=True)

    def __enter__(self) -> "DrawingPool":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def draw_all(jobs: Sequence[tuple[Callable[..., Any], tuple]], *, dpi: int = 100, formats: Sequence[str] = ("png",),
             width: float | None = None, workers: int | None = None, pool: DrawingPool | None = None) -> list[Drawn]:
    """`draw(fn, args)` for each `(fn, args)` of `jobs`, in order, on `workers` processes (this one
    included; default `default_workers()`: one per core, or this process alone when a worker would run the
    caller's script again; 1, or fewer than `PARALLEL_FROM` jobs: all here), or on `pool`'s workers and this
    process (`workers` is then ignored; the pool stays open). `workers` > 1 from a script: its top-level
    code must be under `if __name__ == "__main__":`, as multiprocessing asks of every script that starts one.

    Workers take jobs from the front, one at a time as each finishes the last; this process draws from the
    back. When no job is left, a job a worker holds but has not finished is drawn here rather than waited for
    while the pool is still starting (so a report never waits for the pool to start), and waited for once
    it is warm (the worker is drawing it: waiting is shorter than drawing it again).
    """
    options = {"dpi": dpi, "formats": tuple(formats), "width": width}
    if pool is None:
        workers = default_workers() if workers is None else workers
        if workers <= 1 or len(jobs) < PARALLEL_FROM:
            return [draw(fn, args, **options) for fn, args in jobs]
        with DrawingPool(min(workers, len(jobs) + 1)) as started:  # for these jobs only
            return _draw_shared(jobs, started, options)
    if pool.executor is None:
        return [draw(fn, args, **options) for fn, args in jobs]
    return _draw_shared(jobs, pool, options)


def _draw_shared(jobs: Sequence[tuple[Callable[..., Any], tuple]], pool: DrawingPool, options: dict) -> list[Drawn]:
    """`draw_all`'s sharing of `jobs` between `pool`'s worker processes (from the front) and this one (from the
    back); a job a worker holds is waited for once the pool is warm (it is being drawn), else drawn here."""
    import threading
    from collections import deque
    from concurrent.futures import Future

    out: list[Drawn | None] = [None] * len(jobs)
    untaken = deque(range(len(jobs)))
    held: dict[int, Future] = {}
    lock = threading.Lock()

    def feed(_: Future | None = None) -> None:  # a worker's next job, from the front
        with lock:
            if not untaken:
                return
            i = untaken.popleft()
            try:
                future = pool.executor.submit(draw, *jobs[i], **options)
            except RuntimeError:  # the pool broke (a worker died) or shut down: the job stays here
                untaken.appendleft(i)
                return
            held[i] = future
        future.add_done_callback(feed)

    for _ in range(min(pool.workers - 1, len(jobs))):
        feed()
    while True:
        with lock:
            if not untaken:
                break
            i = untaken.pop()
        out[i] = draw(*jobs[i], **options)
    wait = pool.warm
    for i in sorted(held, reverse=True):  # nothing is fed any more: `held` is complete
        future = held[i]
        if wait:
            with contextlib.suppress(Exception):  # a failed or stuck job is drawn here again (an error raised here)
                future.result(timeout=WAIT_SECONDS)
        done = future.done() and not future.cancelled() and future.exception() is None
        # not done (a worker still starting), or failed (a drawing error is raised here again)
        out[i] = future.result() if done else draw(*jobs[i], **options)
    return out  # type: ignore[return-value]
