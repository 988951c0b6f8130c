"""The figure base: how every figure of headscope is made, sized and written to a file.

`report_figure(width, height)` is the one constructor of a figure: a `ReportFigure`, a matplotlib
`Figure` built without pyplot (no global figure registry, no backend choice, nothing shown twice in
Jupyter) that Jupyter displays through `_repr_png_` as the very PNG the report writes (`to_png`).
`new_figure(width, height, ax)` gives a figure and its one Axes, or the caller's Axes and its figure:
every room that draws (`reports.figures`, `reports.heatmaps`, `reports.sinks`, `reports.syntax`,
`reports.vision`) starts there.

`figure_bytes(fig, fmt)` and `save(fig, path, width=)` write a figure as PNG, SVG or PDF with every
glyph kept (`FORMATS`), scaled to a paper's column (`parse_width`, `fitted`).
"""

from __future__ import annotations

import contextlib
import functools
import io
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Literal, Mapping

from .fonts import font_context

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = [
    "report_figure",
    "new_figure",
    "to_png",
    "figure_bytes",
    "FigureFormat",
    "FORMATS",
    "WIDTH_UNITS",
    "WIDTH_RANGE",
    "PIXEL_RANGE",
    "check_width",
    "parse_width",
    "fitted",
    "save",
]


@functools.lru_cache(maxsize=1)
def _figure_class():
    from matplotlib.figure import Figure

    class ReportFigure(Figure):
        """A matplotlib Figure that Jupyter shows as the same PNG the report writes (`to_png`).

        Figures made without pyplot get no display hook from the inline backend; `_repr_png_`
        gives them one, without touching matplotlib's global state.
        """

        def _repr_png_(self) -> bytes:
            return to_png(self)

    return ReportFigure


def report_figure(width: float, height: float, *, layout: str | None = "constrained") -> Figure:
    """A new `ReportFigure` of `width` × `height` inches, laid out by matplotlib's `layout` (None: the
    caller places its Axes, as the layer × head grids do with fixed margins)."""
    return _figure_class()(figsize=(width, height), layout=layout)


def new_figure(width: float, height: float, ax: Axes | None = None) -> tuple[Figure, Axes]:
    """The caller's `ax` and its figure, or a new constrained `report_figure` with one Axes."""
    if ax is not None:
        return ax.figure, ax
    fig = report_figure(width, height)
    return fig, fig.add_subplot()


def to_png(fig: Figure, *, dpi: int = 100) -> bytes:
    """The figure as PNG bytes, drawn under matplotlib's defaults whatever the caller's rcParams.

    Save a figure once: constrained layout refines itself on every draw, so a second save of the
    same Figure may differ by a pixel (a fresh figure from the same data is identical).
    """
    return figure_bytes(fig, "png", dpi=dpi)


# ---------------------------------------------------------------- files for papers

FigureFormat = Literal["png", "svg", "pdf"]

# Per file format, the rcParams that keep every label's glyphs in the file. PDF embeds subsets of
# the fonts as CID fonts (Type 42: text stays text, and journals refuse Type 3); SVG writes each
# glyph as an outline, so CJK shows even where the reader has no CJK font. The date is left out of
# vector files so the same figure gives the same bytes.
FORMATS: Mapping[str, Mapping[str, Any]] = {
    "png": {"rc": {}, "metadata": None},
    "svg": {"rc": {"svg.fonttype": "path", "svg.hashsalt": "headscope"}, "metadata": {"Date": None}},
    "pdf": {"rc": {"pdf.fonttype": 42}, "metadata": {"CreationDate": None}},
}

# Column widths are given with a unit: 3.5in, 8.9cm, 89mm, 252pt.
WIDTH_UNITS: Mapping[str, float] = {"in": 1.0, "cm": 1 / 2.54, "mm": 1 / 25.4, "pt": 1 / 72}
WIDTH_RANGE = (0.5, 40.0)  # inches: from a thumbnail to a poster
PIXEL_RANGE = (50, 12_000)  # width × dpi of a figure file: an image that can be seen, and one that fits in memory


def check_width(width: float | None, dpi: int) -> None:
    """ValueError unless `width` (inches; None keeps each figure's own) lies in `WIDTH_RANGE` and
    `width × dpi` in `PIXEL_RANGE`: checked before any work, as drawing a 1000in figure runs out of
    memory and a 0.001pt one is an empty image.

    >>> check_width(3.5, 300)
    >>> check_width(40, 1200)
    Traceback (most recent call last):
    ValueError: 40in at 1200 dpi is 48000 pixels wide; give at most 12000 pixels (a smaller --width or --dpi)
    """
    if width is None:
        return
    lo, hi = WIDTH_RANGE
    if not lo <= width <= hi:
        raise ValueError(f"{width:g}in is outside {lo:g}in–{hi:g}in; give a figure width in that range, "
                         "such as 3.5in or 8.9cm")
    pixels, (least, most) = width * dpi, PIXEL_RANGE
    if pixels < least:
        raise ValueError(f"{width:g}in at {dpi} dpi is {pixels:.0f} pixels wide; give at least {least} pixels "
                         "(a larger --width or --dpi)")
    if pixels > most:
        raise ValueError(f"{width:g}in at {dpi} dpi is {pixels:.0f} pixels wide; give at most {most} pixels "
                         "(a smaller --width or --dpi)")


def figure_bytes(fig: Figure, fmt: FigureFormat = "png", *, dpi: int = 100, width: float | None = None) -> bytes:
    """The figure as a `fmt` file (see `FORMATS`); `width` (inches) scales it to a paper's column.

    The figure itself is left as it was (`fitted` restores its size and fonts).
    """
    if fmt not in FORMATS:
        raise ValueError(f"unknown figure format {fmt!r}; choose from {', '.join(FORMATS)}")
    check_width(width, dpi)
    spec = FORMATS[fmt]
    buf = io.BytesIO()
    extra = {"metadata": spec["metadata"]} if spec["metadata"] is not None else {}
    with fitted(fig, width), font_context("", **spec["rc"]):  # some sizes (font.size) are read at draw time
        # constrained layout already fits the figure; bbox_inches="tight" would draw it twice
        fig.savefig(buf, format=fmt, dpi=dpi, facecolor="white", **extra)
    return buf.getvalue()


def parse_width(spec: str) -> float:
    """Inches from a width with its unit (`WIDTH_UNITS`).

    >>> parse_width("3.5in"), parse_width("2.54cm"), parse_width(" 72pt ")
    (3.5, 1.0, 1.0)
    """
    m = re.fullmatch(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-z]+)\s*", str(spec).lower())
    if m is None or m.group(2) not in WIDTH_UNITS or float(m.group(1)) <= 0:
        raise ValueError(f"{spec!r} is not a width; write a positive number and a unit "
                         f"({', '.join(WIDTH_UNITS)}), such as 3.5in or 8.9cm")
    inches = round(float(m.group(1)) * WIDTH_UNITS[m.group(2)], 6)
    lo, hi = WIDTH_RANGE
    if not lo <= inches <= hi:
        raise ValueError(f"{spec!r} is outside {lo:g}in–{hi:g}in; give a figure width in that range, "
                         "such as 3.5in or 8.9cm")
    return inches


@contextlib.contextmanager
def fitted(fig: Figure, width: float | None) -> Iterator[None]:
    """Inside, `fig` is `width` inches wide, its height and every font scaled by the same factor,
    so the figure looks as it does on screen, only smaller or larger (nothing overflows a margin).
    Size and fonts are restored on exit."""
    if width is None:
        yield
        return
    from matplotlib.text import Text

    w, h = fig.get_size_inches()
    k = width / w
    texts = [(t, t.get_fontsize()) for t in fig.findobj(Text)]
    try:
        fig.set_size_inches(width, h * k)
        for t, size in texts:
            t.set_fontsize(size * k)
        yield
    finally:
        fig.set_size_inches(w, h)
        for t, size in texts:
            t.set_fontsize(size)


def save(fig: Figure, path: str | Path, *, dpi: int = 100, width: float | str | None = None) -> Path:
    """Write `fig` to `path`, the format named by its suffix (.png, .svg, .pdf); `width` in inches
    or with a unit ("3.5in"). Returns the path."""
    path = Path(path)
    fmt = path.suffix.lower().lstrip(".")
    if fmt not in FORMATS:
        raise ValueError(f"{path}: give a file name ending in {', '.join('.' + f for f in FORMATS)}")
    inches = parse_width(width) if isinstance(width, str) else width
    path.write_bytes(figure_bytes(fig, fmt, dpi=dpi, width=inches))  # type: ignore[arg-type]
    return path
