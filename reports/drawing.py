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
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

__all__ = ["Drawn", "draw", "draw_all", "drawing_workers", "compact_png", "PARALLEL_FROM"]

PARALLEL_FROM = 4  # jobs: fewer are drawn here (a worker would spend longer starting than drawing them)


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

    image = Image.open(io.BytesIO(png)).convert("RGB")
    buf = io.BytesIO()
    image.quantize(colors=256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE).save(
        buf, format="PNG", optimize=True)
    return buf.getvalue() if buf.tell() < len(png) else png


def draw(fn: Callable[..., Any], args: tuple, *, dpi: int = 100, formats: Sequence[str] = ("png",),
         width: float | None = None) -> Drawn:
    """The figure `fn(*args)` (a `FigureSpec.draw` of `reports.panels.FIGURES`): its PNG at `dpi`, the page's
    copy, and the `formats` files (scaled to `width` inches) when more than the PNG is asked for."""
    from .canvas import figure_bytes, to_png

    fig = fn(*args)
    png = to_png(fig, dpi=dpi)
    files = {} if tuple(formats) == ("png",) and width is None else {  # the PNG drawn once when unscaled
        fmt: png if fmt == "png" and width is None else figure_bytes(fig, fmt, dpi=dpi, width=width)
        for fmt in formats}
    return Drawn(png, compact_png(png), files)


def drawing_workers() -> int:
    """The cores this process may run on (its CPU affinity where the system tells it, else the CPU count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def draw_all(jobs: Sequence[tuple[Callable[..., Any], tuple]], *, dpi: int = 100, formats: Sequence[str] = ("png",),
             width: float | None = None, workers: int | None = None) -> list[Drawn]:
    """`draw(fn, args)` for each `(fn, args)` of `jobs`, in order, on `workers` processes (this one
    included; default `drawing_workers()`; 1, or fewer than `PARALLEL_FROM` jobs: all here).

    Workers take jobs from the front, one at a time as each finishes the last; this process draws from the
    back. When no job is left, a job a worker holds but has not finished (a worker still starting) is
    drawn here rather than waited for, so a report never waits for the pool to start.
    """
    workers = drawing_workers() if workers is None else workers
    options = {"dpi": dpi, "formats": tuple(formats), "width": width}
    if workers <= 1 or len(jobs) < PARALLEL_FROM:
        return [draw(fn, args, **options) for fn, args in jobs]
    import multiprocessing
    import threading
    from collections import deque
    from concurrent.futures import Future, ProcessPoolExecutor

    out: list[Drawn | None] = [None] * len(jobs)
    untaken = deque(range(len(jobs)))
    held: dict[int, Future] = {}
    lock = threading.Lock()
    pool = ProcessPoolExecutor(max_workers=min(workers - 1, len(jobs)), mp_context=multiprocessing.get_context("spawn"))

    def feed(_: Future | None = None) -> None:  # a worker's next job, from the front
        with lock:
            if not untaken:
                return
            i = untaken.popleft()
            try:
                future = pool.submit(draw, *jobs[i], **options)
            except RuntimeError:  # the pool broke (a worker died) or shut down: the job stays here
                untaken.appendleft(i)
                return
            held[i] = future
        future.add_done_callback(feed)

    try:
        for _ in range(min(workers - 1, len(jobs))):
            feed()
        while True:
            with lock:
                if not untaken:
                    break
                i = untaken.pop()
            out[i] = draw(*jobs[i], **options)
        for i in sorted(held, reverse=True):  # nothing is fed any more: `held` is complete
            future = held[i]
            done = future.done() and not future.cancelled() and future.exception() is None
            # not done (a worker still starting, or busy), or failed (a drawing error is raised here again)
            out[i] = future.result() if done else draw(*jobs[i], **options)
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    return out  # type: ignore[return-value]
