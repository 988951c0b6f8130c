"""Figures of attention, head scores, probes and verification — the same from the CLI and a notebook.

Every function takes plain results (`AttentionMap`, `HeadScores`, `ProbeResult`, `Verification`,
DataFrames), never a model, and returns a `matplotlib.figure.Figure`. Figures are built with
`Figure()` rather than pyplot: no global figure registry, no backend choice, nothing shown twice in
Jupyter, where they display through `_repr_png_` as the very PNG the report writes. Text is drawn
with fonts that cover CJK, Arabic and emoji (`reports.fonts`).

Head and layer arguments are model indices (`amap.layer_ids` / `amap.head_ids`), so a map that
kept only some heads is addressed the same way as a full one.

`plot(result, **kw)` picks the figure by the result's type. `FIGURES` lists the report's figures:
each entry names the part of a report section it draws, how, its file stem and caption; the report
(`reports.html`) draws what the registry lists, so a new report figure is one entry.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import io
import math
import re
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Literal, Mapping, Sequence

import numpy as np

from headscope.analyses.coref import ProbeResult
from headscope.analyses.flow import FLOW_MAX_EDGES, FLOW_MAX_SECONDS, TOKEN_MAPS, TokenMap, flow, flow_fits
from headscope.analyses.heads import HeadScores
from headscope.analyses.metrics import METRICS
from headscope.analyses.patching import PatchResult
from headscope.probe.attribution import DLAResult
from headscope.probe.types import AttentionMap, head_name
from headscope.probe.verify import Verification

from .fonts import font_context
from .sinks import massive_figure, sink_share_grid, streaming_figure
from .syntax import cluster_plot, relation_bars, relation_grid, tree_figure
from .vision import layer_overlays, patch_overlay, patch_rollout

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure
    import pandas as pd

__all__ = [
    "attention_heatmap",
    "attention_mosaic",
    "token_map",
    "score_grid",
    "probe_grid",
    "difference_grid",
    "probe_drilldown",
    "verification_plot",
    "signed_grid",
    "dla_grid",
    "patch_grid",
    "best_heads",
    "plot",
    "FigureSpec",
    "Panel",
    "FIGURES",
    "STACKS",
    "plotted_metrics",
    "start_head",
    "slug",
    "display_label",
    "to_png",
    "figure_bytes",
    "FigureFormat",
    "FORMATS",
    "WIDTH_UNITS",
    "parse_width",
    "fitted",
    "save",
]

_MASKED = "#eeeeee"  # cells a causal model cannot attend to


def display_label(label: str) -> str:
    """A token as a readable axis label: whitespace made visible, never empty.

    >>> display_label("\\n"), display_label(" "), display_label("Ġthe")
    ('↵', '␣', 'Ġthe')
    """
    shown = label.replace("\n", "↵").replace("\t", "⇥").replace("\r", "")
    return shown if shown.strip() else "␣"


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


def _new_figure(width: float, height: float, **kwargs) -> Figure:
    return _figure_class()(figsize=(width, height), **kwargs)


def _figure(width: float, height: float, ax: Axes | None) -> tuple[Figure, Axes]:
    if ax is not None:
        return ax.figure, ax
    fig = _new_figure(width, height, layout="constrained")
    return fig, fig.add_subplot()


def _index(ids: Sequence[int], wanted: int, what: str) -> int:
    try:
        return list(ids).index(wanted)
    except ValueError:
        raise ValueError(f"{what} {wanted} is not in this map; it holds {what}s {list(ids)}") from None


def _upright(label: str) -> bool:
    """Whether a column label reads better upright: one character, or two wide (CJK) ones.

    >>> _upright("我爱"), _upright("."), _upright("it")
    (True, True, False)
    """
    import unicodedata

    return len(label) == 1 or (len(label) == 2 and all(unicodedata.east_asian_width(c) in "WF" for c in label))


def _label_size(n: int) -> float:
    """Font size (points) that keeps n labels legible at the cell size `_cell` gives."""
    return 10.0 if n <= 24 else max(6.0, 10.0 - (n - 24) / 10)


def _cell(n: int) -> float:
    """Inches per heatmap cell: roomy for short texts, tighter (never cramped) for long ones."""
    return 0.34 if n <= 24 else max(0.2, 0.34 - (n - 24) * 0.004)


# ---------------------------------------------------------------- attention of one head


def attention_heatmap(
    amap: AttentionMap,
    layer: int,
    head: int,
    *,
    ax: Axes | None = None,
    title: str | None = None,
    cmap: str = "Blues",
) -> Figure:
    """Attention of one head: rows = query units, columns = key units, a label on every row and column.

    `amap` is an `AttentionMap` or a `CrossAttentionMap` (rows the target's units, columns the source's).
    Causal models leave the upper triangle unseen: it is drawn in grey, not as zero attention.

    >>> import torch
    >>> from headscope.probe.types import AttentionMap
    >>> a = torch.tensor([[[[0.9, 0.1], [0.3, 0.7]]]])          # [layer, head, query, key]
    >>> m = AttentionMap(text="我爱", level="word", labels=("我", "爱"), spans=((0, 1), (1, 2)),
    ...                  special=(False, False), attention=a, causal=False)
    >>> fig = attention_heatmap(m, 0, 0)
    >>> [t.get_text() for t in fig.axes[0].get_xticklabels()]
    ['我', '爱']
    """
    if layer in getattr(amap, "no_attention", ()):
        raise ValueError(f"layer {layer} has {NO_ATTENTION} (a layer of a hybrid stack); this map's attention "
                         f"layers are {list(amap.layer_ids)}")
    li, hi = _index(amap.layer_ids, layer, "layer"), _index(amap.head_ids, head, "head")
    weights = amap.attention[li, hi].detach().float().cpu().numpy()  # [query, key]
    model = amap.meta.get("model", "")
    cross = hasattr(amap, "queries")
    return _token_heatmap(weights, amap, ax=ax, cmap=cmap, cbar="attention weight",
                          title=title or f"{model + ' · ' if model else ''}{'cross-attention · ' if cross else ''}"
                                         f"layer {layer} head {head} · {amap.level} level",
                          xlabel="source key (attended to)" if cross else "key (attended to)",
                          ylabel="target query (attending)" if cross else "query (attending)")


# A token heatmap's size is bounded whatever the text's length: at most CELLS_MAX cells per axis (a longer text
# is drawn as a pooled overview, each cell the mean over a block of units), at most SIDE_MAX inches per side, and
# at most LABELS_MAX tick labels per axis (every k-th unit's label beyond that).
CELLS_MAX = 256
SIDE_MAX = 20.0
LABELS_MAX = 80


def _pooled(weights: np.ndarray, block: int) -> np.ndarray:
    """Mean over `block` × `block` tiles (NaN, the cells a causal model cannot see, left out; a tile of
    only NaN stays NaN); the last tiles may be smaller.

    >>> _pooled(np.arange(16.0).reshape(4, 4), 2).tolist()
    [[2.5, 4.5], [10.5, 12.5]]
    """
    if block == 1:
        return weights
    n_q, n = weights.shape
    m_q, m = -(-n_q // block), -(-n // block)
    padded = np.full((m_q * block, m * block), np.nan)
    padded[:n_q, :n] = weights
    tiles = padded.reshape(m_q, block, m, block)
    counts = np.isfinite(tiles).sum(axis=(1, 3))
    sums = np.nansum(tiles, axis=(1, 3))
    return np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)


def _token_heatmap(weights: np.ndarray, amap: AttentionMap, *, ax: Axes | None, cmap: str, cbar: str,
                   title: str, xlabel: str = "key (attended to)", ylabel: str = "query (attending)") -> Figure:
    """A [query, key] map over `amap`'s units, a label on every row and column; a causal map's upper triangle grey.
    A cross-attention map's rows are the target's units and its columns the source's.

    Its size is bounded (`CELLS_MAX`, `SIDE_MAX`, `LABELS_MAX`): a long text is drawn pooled, with every
    k-th label, and the title says so. A plain `pcolormesh` (seaborn's heatmap measured every label
    against every other: gigabytes for a few hundred tokens).
    """
    import matplotlib as mpl

    rows = [display_label(t) for t in getattr(amap, "queries", amap).labels]
    labels = [display_label(t) for t in getattr(amap, "keys", amap).labels]
    n_q, n = len(rows), len(labels)
    values = np.array(weights, dtype=float)  # a copy: the caller's array is left alone
    if amap.causal:
        values[np.triu(np.ones((n_q, n), dtype=bool), k=1)] = np.nan
    block = -(-max(n, n_q) // CELLS_MAX)
    drawn = _pooled(values, block)
    m_q, m = drawn.shape
    cell = min(_cell(max(m, m_q)), SIDE_MAX / max(m, m_q))
    step = -(-max(m, m_q) // LABELS_MAX)
    notes = ([f"pooled {block}×{block}"] if block > 1 else []) + ([f"a label every {step * block} units"] if step > 1 else [])
    full_title = f"{title} · {', '.join(notes)}" if notes else title
    colours = mpl.colormaps[cmap].with_extremes(bad=_MASKED)
    with font_context("".join(rows + labels) + str(title or "") + str(amap.meta.get("model", ""))):
        fig, ax = _figure(m * cell + 2.4, m_q * cell + 1.4, ax)
        ax.set_facecolor(_MASKED)
        mesh = ax.pcolormesh(np.ma.masked_invalid(drawn), cmap=colours, vmin=0.0, vmax=1.0)
        ax.set_xlim(0, m)
        ax.set_ylim(m_q, 0)
        ax.set_aspect("equal")
        for side in ax.spines.values():
            side.set_visible(False)
        fig.colorbar(mesh, ax=ax, label=cbar, shrink=0.6 if max(m, m_q) > 12 else 0.9)
        size = _label_size(len(range(0, max(m, m_q), step)))
        ax.set_xticks([i + 0.5 for i in range(0, m, step)], [labels[i * block] for i in range(0, m, step)])
        ax.set_yticks([i + 0.5 for i in range(0, m_q, step)], [rows[i * block] for i in range(0, m_q, step)])
        ax.tick_params(axis="x", labelsize=size, length=0)
        for tick in ax.get_xticklabels():  # one character (or two CJK ones) upright, the rest vertical
            tick.set_rotation(0 if _upright(tick.get_text()) else 90)
        ax.tick_params(axis="y", labelrotation=0, labelsize=size, length=0)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_title(full_title, fontsize=11)
    return fig


def token_map(amap: AttentionMap, kind: TokenMap = "rollout", *, ax: Axes | None = None, cmap: str = "Purples") -> Figure:
    """Attention rollout or flow (Abnar & Zuidema 2020, `analyses.flow.TOKEN_MAPS`) of one text:
    row i = output token i after the last layer, column j = how much of it comes from input token j.

    >>> import torch
    >>> from headscope.probe.types import AttentionMap
    >>> a = torch.tensor([[[[1.0, 0.0], [0.5, 0.5]]]])          # [layer, head, query, key]
    >>> m = AttentionMap(text="a b", level="token", labels=("a", "b"), spans=((0, 1), (2, 3)),
    ...                  special=(False, False), attention=a, causal=True)
    >>> token_map(m, "flow").axes[0].get_title()
    'attention flow · token level'
    """
    if kind not in TOKEN_MAPS:
        raise ValueError(f"kind must be one of {', '.join(TOKEN_MAPS)}, got {kind!r}")
    attention = amap.attention.detach().float().cpu()
    model = amap.meta.get("model", "")
    try:  # a flow gets FLOW_MAX_SECONDS; beyond that the figure says it was skipped, and why
        weights = (flow(attention, max_seconds=FLOW_MAX_SECONDS, progress=None) if kind == "flow"
                   else TOKEN_MAPS[kind](attention)).numpy()  # [query, key]
    except TimeoutError as exc:
        with font_context(amap.text + model):
            fig, ax = _figure(6.0, 1.6, ax)
            ax.axis("off")
            ax.text(0.5, 0.5, textwrap.fill(f"Attention flow skipped: {exc}. The rollout above is drawn; "
                                            "for the flow, use a shorter text.", 80),
                    ha="center", va="center", fontsize=10, transform=ax.transAxes)
            ax.set_title(f"{model + ' · ' if model else ''}attention flow skipped · {amap.level} level", fontsize=11)
        return fig
    return _token_heatmap(weights, amap, ax=ax, cmap=cmap, cbar=f"share of the output ({kind})",
                          title=f"{model + ' · ' if model else ''}attention {kind} · {amap.level} level",
                          xlabel="input token", ylabel="output token (after the last layer)")


def attention_mosaic(amap: AttentionMap, *, cmap: str = "viridis", max_width: float = 16.0) -> Figure:
    """Small multiples: every head of every layer for one text (rows = layers, columns = heads).

    Drawn as one image (one tile per head), so 30 × 9 heads cost the same as 6 × 12. The colour
    scale is square-root so weak but structured patterns stay visible.
    """
    from matplotlib.colors import PowerNorm

    att = amap.attention.detach().float().cpu().numpy()  # [layer, head, query, key]
    _, n_h, n, _ = att.shape
    rows = sorted(set(amap.layer_ids) | set(amap.no_attention))  # a hybrid's other layers: labelled empty bands
    n_l = len(rows)
    gap = max(1, n // 8)
    tile = n + gap
    mosaic = np.full((n_l * tile - gap, n_h * tile - gap), np.nan)
    for i, layer in enumerate(rows):
        if layer not in amap.layer_ids:
            continue
        for j in range(n_h):
            block = att[amap.layer_ids.index(layer), j].copy()
            if amap.causal:
                block[np.triu_indices(n, k=1)] = np.nan
            mosaic[i * tile : i * tile + n, j * tile : j * tile + n] = block
    width = min(max_width, 1.0 + 0.9 * n_h)
    height = width * (n_l / n_h) * 0.98 + 0.9
    with font_context(amap.text + str(amap.meta.get("model", ""))):
        fig, ax = _figure(width + 1.0, height, None)
        ax.set_facecolor("white")
        img = ax.imshow(mosaic, cmap=cmap, norm=PowerNorm(0.5, vmin=0, vmax=1), interpolation="nearest")
        ax.set_xticks([j * tile + n / 2 - 0.5 for j in range(n_h)], [str(h) for h in amap.head_ids], fontsize=8)
        ax.set_yticks([i * tile + n / 2 - 0.5 for i in range(n_l)], [str(l) for l in rows], fontsize=8)
        for i, layer in enumerate(rows):
            if layer in amap.no_attention:
                ax.text((n_h * tile - gap) / 2 - 0.5, i * tile + n / 2 - 0.5, f"L{layer}: {NO_ATTENTION}",
                        ha="center", va="center", fontsize=8, color="#444444")
        ax.tick_params(length=0, labeltop=True, labelbottom=False)
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
        for side in ax.spines.values():
            side.set_visible(False)
        fig.colorbar(img, ax=ax, shrink=min(0.6, 4.0 / height), label="attention weight (√ scale)")
        text = amap.text if len(amap.text) <= 70 else amap.text[:67] + "…"
        model = amap.meta.get("model", "")
        ax.set_title(f"{model + ': ' if model else ''}every head on “{text}” ({amap.level} level)", fontsize=10)
    return fig


# ---------------------------------------------------------------- layer x head grids


def _grid_heatmap(ax: Axes, grid: pd.DataFrame, *, vmin: float, vmax: float, cmap: str, center: float | None,
                  fmt: str, label: str) -> None:
    """One cell per (layer, head), numbers in the cells while they stay legible; NaN cells grey.

    Plain `imshow` with fixed margins rather than seaborn + constrained layout: a report draws a
    dozen of these per model, and this is about twice as fast.
    """
    import matplotlib as mpl
    import seaborn  # noqa: F401  (registers the rocket / mako / vlag colour maps)
    from matplotlib.colors import Normalize, TwoSlopeNorm

    values = grid.to_numpy(dtype=float)
    n_l, n_h = values.shape
    colours = mpl.colormaps[cmap].with_extremes(bad=_MASKED)
    norm = (TwoSlopeNorm(center, vmin, vmax) if center is not None and vmin < center < vmax
            else Normalize(vmin, vmax if vmax > vmin else vmin + 1))
    img = ax.imshow(np.ma.masked_invalid(values), cmap=colours, norm=norm, aspect="auto", interpolation="nearest")
    if values.size <= 150:
        size = 7 if n_h <= 12 else 6
        for (i, j), v in np.ndenumerate(values):
            if math.isfinite(v):
                r, g, b, _ = colours(norm(v))
                ink = "white" if 0.299 * r + 0.587 * g + 0.114 * b < 0.5 else "black"
                ax.text(j, i, format(v, fmt), ha="center", va="center", fontsize=size, color=ink)
    ax.set_xticks(range(n_h), [str(h) for h in grid.columns])
    ax.set_yticks(range(n_l), [str(l) for l in grid.index])
    ax.set_xticks(np.arange(n_h + 1) - 0.5, minor=True)
    ax.set_yticks(np.arange(n_l + 1) - 0.5, minor=True)
    ax.grid(which="minor", color="white", linewidth=0.8)
    ax.tick_params(which="both", length=0)
    for side in ax.spines.values():
        side.set_visible(False)
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.figure.colorbar(img, ax=ax, shrink=0.8 if n_l <= 12 else 0.4, label=label, pad=0.02)


NO_ATTENTION = "no softmax attention"  # the label of a hybrid stack's layer without attention, in every figure


def with_no_attention_rows(grid: pd.DataFrame, no_attention: Sequence[int]) -> pd.DataFrame:
    """`grid` (index = model layers) with a row for each layer in `no_attention`, in layer order, all NaN: drawn
    by `_label_no_attention` as a labelled row, so L3 of the model stays L3 and is never a row of zeros.

    >>> import pandas as pd
    >>> g = pd.DataFrame([[0.5, 0.2]], index=pd.Index([1], name="layer"), columns=[0, 1])
    >>> with_no_attention_rows(g, (0, 2)).index.tolist()
    [0, 1, 2]
    """
    if not no_attention:
        return grid
    return grid.reindex(sorted(set(grid.index) | set(no_attention))).rename_axis(grid.index.name)


def _label_no_attention(ax: Axes, rows: Sequence[int], no_attention: Sequence[int], n_cols: int) -> None:
    """Hatch each row of a layer without softmax attention and write so across it (row order = `rows`)."""
    from matplotlib.patches import Rectangle

    for layer in no_attention:
        if layer not in rows:
            continue
        r = list(rows).index(layer)
        ax.add_patch(Rectangle((-0.5, r - 0.5), n_cols, 1, facecolor="white", edgecolor="#999999", hatch="///",
                               lw=0.6, zorder=3))
        ax.text((n_cols - 1) / 2, r, f"L{layer}: {NO_ATTENTION}", ha="center", va="center", fontsize=7,
                color="#444444", zorder=5, bbox=dict(facecolor="white", edgecolor="none", pad=1.0))


def _outline(ax: Axes, grid: pd.DataFrame, cells: Sequence[tuple[int, int]], colour: str = "#d62728") -> None:
    """Box the (layer, head) cells, the grid's index/columns being model indices."""
    from matplotlib.patches import Rectangle

    rows, cols = list(grid.index), list(grid.columns)
    for rank, (layer, head) in enumerate(cells):
        if layer in rows and head in cols:
            r, c = rows.index(layer), cols.index(head)
            ax.add_patch(Rectangle((c - 0.5, r - 0.5), 1, 1, fill=False, edgecolor=colour,
                                   lw=2.6 if rank == 0 else 1.6, clip_on=False, zorder=4))  # above the grid lines


def _grid_size(grid: pd.DataFrame) -> tuple[float, float]:
    n_l, n_h = grid.shape
    return min(14.0, 2.2 + 0.62 * n_h), min(16.0, 1.6 + (0.42 if n_l <= 12 else 0.3) * n_l)


def _grid_figure(grid: pd.DataFrame, ax: Axes | None) -> tuple[Figure, Axes]:
    """A figure for a grid with fixed margins (inches), unless the caller gave the axes."""
    if ax is not None:
        return ax.figure, ax
    w, h = _grid_size(grid)
    fig = _new_figure(w, h)
    fig.subplots_adjust(left=0.75 / w, right=1 - 0.1 / w, bottom=0.55 / h, top=1 - 0.62 / h)
    return fig, fig.add_subplot()


def best_heads(scores: Any, metric: str, k: int = 3) -> list[tuple[int, int, float]]:
    """The k most notable heads of `metric` as (layer, head, value), best first.

    Uses `scores.top` (the analyses decide what "best" means); NaN cells never rank.
    """
    top = scores.top(metric, k=k)
    if top is None or len(top) == 0:
        return []
    return [(int(r.layer), int(r.head), float(r.value)) for r in top.itertuples() if not math.isnan(float(r.value))]


def score_grid(scores: Any, metric: str, *, ax: Axes | None = None, k: int = 3) -> Figure:
    """Layer × head grid of one head score (`HeadScores.grid(metric)`), the k top heads boxed.

    Cells where the metric does not apply (NaN, e.g. next_token for a decoder) stay grey.
    """
    spec = scores.registry[metric]
    no_attention = tuple(getattr(scores, "no_attention", ()))
    grid = with_no_attention_rows(scores.grid(metric), no_attention)  # a hybrid's other layers: labelled rows
    values = grid.to_numpy(dtype=float)
    finite = values[np.isfinite(values)]
    vmin, vmax = spec.value_range
    # a fixed range (an attention share) on the light-to-dark "rocket"; an open one (entropy) up to its largest value
    cmap = "rocket_r" if vmax is not None else "mako_r"
    if vmax is None:
        vmax = float(finite.max()) if finite.size else 1.0
    label = f"{spec.label} ({spec.unit})" if spec.unit else spec.label
    best = best_heads(scores, metric, k)
    with font_context(f"{scores.model}{metric}"):
        fig, ax = _grid_figure(grid, ax)
        _grid_heatmap(ax, grid, vmin=vmin, vmax=vmax, cmap=cmap, center=None, fmt=".2f", label=label)
        _label_no_attention(ax, list(grid.index), no_attention, grid.shape[1])
        _outline(ax, grid, [(l, h) for l, h, _ in best])
        head = f"{scores.model} · {spec.label} ({scores.level} level)"
        if not finite.size:
            sub = "not applicable to this model"
        else:
            sub = "top: " + ", ".join(f"{head_name(l, h)} {v:.2f}" for l, h, v in best)
        ax.set_title(f"{head}\n{sub}", fontsize=10)
    return fig


def signed_grid(grid: pd.DataFrame, *, title: str, label: str, ax: Axes | None = None, k: int = 3,
                fmt: str = ".2f") -> Figure:
    """A layer × head grid of signed numbers (index: layer, columns: head) on a diverging scale
    centred at 0, the k largest |values| boxed: direct logit attribution, patching effects."""
    values = grid.to_numpy(dtype=float)
    finite = values[np.isfinite(values)]
    bound = float(np.abs(finite).max()) if finite.size and np.abs(finite).max() > 0 else 1.0
    flat = [(int(l), int(h), float(grid.loc[l, h])) for l in grid.index for h in grid.columns
            if math.isfinite(float(grid.loc[l, h]))]
    best = sorted(flat, key=lambda x: -abs(x[2]))[:k]
    with font_context(title):
        fig, ax = _grid_figure(grid, ax)
        _grid_heatmap(ax, grid, vmin=-bound, vmax=bound, cmap="vlag", center=0.0, fmt=fmt, label=label)
        _outline(ax, grid, [(l, h) for l, h, _ in best])
        width = fig.get_figwidth()
        ax.set_title(textwrap.fill(title, max(40, int(width * 11))), fontsize=9)
    return fig


def dla_grid(result: DLAResult, *, ax: Axes | None = None, k: int = 3) -> Figure:
    """Direct logit attribution of every head (`DLAResult.grid()`), with the identity in the title."""
    top = ", ".join(f"{r.component} {r.value:+.2f}" for r in result.top(3).itertuples())
    title = (f"{result.model} · {result.what} = {result.total:.3f}; top parts {top}; "
             f"parts sum to the model's number within {result.identity_abs_err:.0e}")
    return signed_grid(result.grid(), title=title, label="direct logit attribution", ax=ax, k=k)


def patch_grid(result: PatchResult, *, ax: Axes | None = None, k: int = 3) -> Figure:
    """Head-output patching: the normalised metric with each head patched (0 = corrupt run, 1 = clean run)."""
    what = {"head_out": "head outputs", "pattern": "head patterns", "q": "head queries", "k": "head keys",
            "v": "head values"}.get(result.what, result.what)
    if result.sender is not None:
        what = f"the path from L{result.sender[0]}H{result.sender[1]} into each head's {result.sites[0][0]}"
    title = (f"{result.model} · {result.direction} patching of {what} on {len(result.pairs)} pairs "
             f"(logit difference clean {result.clean.mean():.2f}, corrupt {result.corrupt.mean():.2f})")
    if result.confirmation is not None:
        c = result.confirmation
        title += f"; held-out: chosen heads {c.fraction:.0%}, random sets {np.mean(c.random_fractions):.0%}"
    return signed_grid(result.grid("normalised"), title=title, label="normalised metric (0 corrupt, 1 clean)", ax=ax,
                       k=k)


def composition_graph(scores: Any, *, kind: str = "k", k: int = 25, ax: Axes | None = None) -> Figure:
    """The strongest `kind`-composition edges (`CompositionScores.top`, by the ratio to random matrices)
    as a graph: heads as nodes, one column per layer (networkx's multipartite layout), edge width and
    colour by the ratio; only heads on a drawn edge are shown, so a 30-layer model stays readable."""
    import networkx as nx

    top = scores.top(k, kind=kind)
    g = nx.DiGraph()
    for r in top.itertuples():
        g.add_node(r.sender, layer=int(r.sender_layer))
        g.add_node(r.receiver, layer=int(r.receiver_layer))
        g.add_edge(r.sender, r.receiver, ratio=float(r.ratio))
    names = {"q": "Q", "k": "K", "v": "V"}
    base = float(scores.baseline[kind]) if kind in scores.baseline else math.nan
    title = (f"{scores.model} · the {len(top)} strongest {names.get(kind, kind)}-composition edges "
             f"(score / random-matrix baseline {base:.3f}; width and colour: the ratio)")
    with font_context(title):
        fig, ax = _figure(9.0, 5.5, ax)
        if g.number_of_nodes():
            pos = nx.multipartite_layout(g, subset_key="layer")
            ratios = [d["ratio"] for _, _, d in g.edges(data=True)]
            hi = max(ratios)
            nx.draw_networkx_nodes(g, pos, ax=ax, node_size=420, node_color="#dde6f0", edgecolors="#4a6a8a")
            nx.draw_networkx_labels(g, pos, ax=ax, font_size=7)
            nx.draw_networkx_edges(g, pos, ax=ax, width=[0.5 + 3.0 * r / hi for r in ratios], edge_color=ratios,
                                   edge_cmap=_colormap("rocket_r"), arrows=True, arrowsize=10,
                                   connectionstyle="arc3,rad=0.15", node_size=420)
        else:
            ax.text(0.5, 0.5, "no edges (a model of one layer)", ha="center", va="center", transform=ax.transAxes)
        ax.margins(0.08)
        ax.set_axis_off()
        ax.set_title(textwrap.fill(title, 110), fontsize=9)
    return fig


def _colormap(name: str):
    import seaborn as sns

    return sns.color_palette(name, as_cmap=True)


def difference_grid(comparison: Any, metric: str, *, ax: Axes | None = None) -> Figure:
    """B − A of one metric per head (`HeadComparison.grid`) on a diverging scale centred at 0, the
    changed heads boxed (the largest change thickest)."""
    grid = comparison.grid(metric)
    values = grid.to_numpy(dtype=float)
    finite = np.abs(values[np.isfinite(values)])
    bound = float(finite.max()) if finite.size and finite.max() > 0 else 1.0
    rows = comparison.changed()
    changed = [(int(r.layer), int(r.head)) for r in rows[rows["metric"] == metric].itertuples()]
    label = METRICS[metric].label if metric in METRICS else metric
    with font_context(f"{comparison.a}{comparison.b}{metric}"):
        fig, ax = _grid_figure(grid, ax)
        _grid_heatmap(ax, grid, vmin=-bound, vmax=bound, cmap="vlag", center=0.0, fmt="+.2f",
                      label=f"{label}: B − A")
        _outline(ax, grid, changed)
        ax.set_title(f"{label}: {comparison.b} − {comparison.a} over {comparison.n_texts} texts\n"
                     f"{len(changed)} changed head{'s' if len(changed) != 1 else ''} (boxed)", fontsize=10)
    return fig


def probe_grid(result: Any, no_attention: Sequence[int] = (), *, ax: Axes | None = None) -> Figure:
    """Per-head accuracy of a probe (`ProbeResult.heads`) as a layer × head grid, best head boxed.

    The colour scale is centred on the chance baseline: blue above chance, red below. `no_attention`: a hybrid
    stack's layers without softmax attention, drawn as labelled rows.
    """
    heads = result.heads
    grid = heads.pivot(index="layer", columns="head", values="accuracy").sort_index().sort_index(axis=1)
    grid = with_no_attention_rows(grid, tuple(no_attention))
    chance = result.baselines.get("chance") if result.baselines else None
    with font_context(f"{result.model}{result.task}{result.verdict}"):
        fig, ax = _grid_figure(grid, ax)
        _grid_heatmap(ax, grid, vmin=0.0, vmax=1.0, cmap="vlag_r", center=chance, fmt=".2f",
                      label="accuracy (all examples)")
        _label_no_attention(ax, list(grid.index), tuple(no_attention), grid.shape[1])
        if result.best_head is not None:
            _outline(ax, grid, [tuple(result.best_head)], colour="black")
        ax.set_title(f"{result.model} · {result.task} (n={result.n})\n{_probe_headline(result)}", fontsize=10)
    return fig


def _probe_headline(result: Any) -> str:
    if result.best_head is None or result.heldout_accuracy is None:
        return result.verdict
    layer, head = result.best_head
    ci = f" [{result.ci95[0]:.0%}–{result.ci95[1]:.0%}]" if result.ci95 else ""
    base = ", ".join(f"{k} {v:.0%}" for k, v in (result.baselines or {}).items()
                     if v is not None and math.isfinite(v))
    return (f"selected {head_name(layer, head)} · held-out accuracy {result.heldout_accuracy:.0%}{ci}, "
            f"n={result.heldout_n} · baselines: {base}")


def probe_drilldown(result: Any, *, max_examples: int = 12, ax: Axes | None = None) -> Figure:
    """The selected head, example by example: its attention from the source word to each candidate.

    One group of bars per example (`ProbeResult.examples`: `chosen` = the candidate the head
    attends to most, `correct` = the right answer), headed by the sentence. The chosen bar is dark
    blue when it is the answer and red when it is not; the answer's label is marked ✓. One axis,
    one scale for every example.
    """
    ex = result.examples
    ids = _drilldown_examples(ex, max_examples)
    shown = ex[ex["example"].isin(ids)]
    chars = "".join(map(str, shown[["text", "source", "candidate"]].to_numpy().ravel()))
    with font_context(chars + f"✓{result.model}{result.task}"):
        fig, ax = _figure(9.0, 0.9 + 0.21 * (len(shown) + 1.6 * len(ids)), ax)
        if not ids:
            ax.text(0.5, 0.5, "no examples", ha="center", va="center")
            ax.set_axis_off()
            return fig
        y, ticks, names, right = 0.0, [], [], 0
        for eid in ids:
            rows = shown[shown["example"] == eid]
            first = rows.iloc[0]
            text = str(first["text"])
            text = text if len(text) <= 100 else text[:97] + "…"
            ax.text(0, y - 0.15, f"“{text}” — from “{first['source']}”", fontsize=8, va="bottom", ha="left",
                    transform=ax.get_yaxis_transform())
            y += 0.45
            for r in rows.itertuples():
                colour = ("#1f4e9c" if r.correct else "#d62728") if r.chosen else "#c9d6e8"
                ax.barh(y, float(r.attention) if r.attention == r.attention else 0.0, color=colour, height=0.72)
                ticks.append(y)
                names.append(display_label(str(r.candidate)) + (" ✓" if r.correct else ""))
                right += bool(r.chosen and r.correct)
                y += 1.0
            y += 0.9
        ax.set_yticks(ticks, names, fontsize=8)
        ax.set_ylim(y - 0.6, -0.9)
        top = float(np.nanmax(shown["attention"].astype(float).to_numpy(), initial=0.0))
        ax.set_xlim(0, max(top * 1.1, 1e-6))
        ax.set_xlabel("attention from the source word to the candidate", fontsize=8)
        ax.tick_params(axis="x", labelsize=7)
        ax.grid(axis="x", color="#eeeeee")
        ax.set_axisbelow(True)
        layer_head = head_name(*result.best_head) if result.best_head else "no head selected"
        total = ex["example"].nunique()
        ax.set_title(f"{result.model} · {result.task} · head {layer_head}\n{len(ids)} of {total} examples "
                     f"(wrong ones first): the answer gets the most attention in {right}", fontsize=10)
    return fig


def _drilldown_examples(ex: pd.DataFrame, k: int) -> list:
    """Up to k example ids: the head's mistakes first (up to half), then the rest, in data order."""
    ok = ex.groupby("example", sort=False).apply(lambda g: bool((g["chosen"] & g["correct"]).any()),
                                                 include_groups=False)
    wrong = [e for e, good in ok.items() if not good][: k // 2]
    rest = [e for e in ok.index if e not in set(wrong)]
    return (wrong + rest)[:k]


# ---------------------------------------------------------------- verification


def verification_plot(verification: Verification, *, ax: Axes | None = None) -> Figure:
    """Max |Δ| per layer between the model's attention and ours (log scale), tolerance drawn."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    frame = verification.to_frame()
    floor = 1e-12  # an exact match (Δ = 0) still gets a visible bar on a log axis
    with font_context(verification.summary() + verification.model):
        fig, ax = _figure(min(12.0, 4.5 + 0.25 * len(frame)), 3.4, ax)
        x = frame["layer"].to_numpy()
        colours = ["#2ca02c" if p else "#d62728" for p in frame["passed"]]
        ax.bar(x, np.maximum(frame["max_abs_err"].to_numpy(dtype=float), floor), color=colours, width=0.7,
               label="attention probabilities: max |Δ|")
        ax.plot(x, np.maximum(frame["max_rel_err_output"].to_numpy(dtype=float), floor), "o-", color="#555555",
                ms=3, lw=1, label="block output: max |Δ| / max |ref|")
        ax.axhline(verification.tolerance, color="#d62728", ls="--", lw=1,
                   label=f"tolerance {verification.tolerance:g}")
        ax.set_yscale("log")
        # Plain "1e-05" tick labels: mathtext ones would print as "$\mathdefault{...}$" with parse_math off.
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:.0e}"))
        ax.yaxis.set_minor_formatter(NullFormatter())
        worst = float(np.nanmax(frame[["max_abs_err", "max_rel_err_output"]].to_numpy(dtype=float), initial=floor))
        lowest = float(np.nanmin(frame[["max_abs_err", "max_rel_err_output"]].to_numpy(dtype=float), initial=1.0))
        ax.set_ylim(max(floor, lowest) / 5, max(worst, verification.tolerance) * 300)  # room for the legend
        ax.set_xlabel("layer")
        ax.set_ylabel("error")
        ax.set_xticks(x if len(x) <= 32 else x[::2])
        for layer in verification.no_attention:  # a hybrid stack's layers without attention: named, not a gap
            ax.axvspan(layer - 0.35, layer + 0.35, facecolor="white", edgecolor="#999999", hatch="///", lw=0.6)
            ax.text(layer, max(floor, lowest) / 3, f"L{layer}: {NO_ATTENTION}", rotation=90, ha="center",
                    va="bottom", fontsize=7, color="#444444", bbox=dict(facecolor="white", edgecolor="none", pad=1.0))
        if verification.no_attention:
            ax.set_xticks(sorted({*x.tolist(), *verification.no_attention}))
        ax.legend(fontsize=7, loc="upper left", framealpha=0.9)
        width = fig.get_figwidth()
        ax.set_title(textwrap.fill(verification.summary(), int(width * 12)), fontsize=9,
                     color="black" if verification.passed else "#d62728")
    return fig


# ---------------------------------------------------------------- one call for any result


@functools.singledispatch
def plot(result: Any, **kwargs: Any) -> Figure:
    """The figure of a result: `plot(amap, layer=, head=)`, `plot(scores, metric=)`, `plot(verification)`,
    `plot(probe_result)`; keyword arguments go to the drawing function."""
    raise TypeError(f"no figure is defined for a {type(result).__name__}; plot takes an AttentionMap, "
                    "a HeadScores, a Verification or a ProbeResult")


@plot.register(AttentionMap)
def _plot_attention(result: AttentionMap, *, layer: int, head: int | None = None, view: str | None = None,
                    **kwargs: Any) -> Figure:
    """An image's map is drawn over its patches: `head` from [CLS] (or `query=`), every head of `layer`
    without a head, `view="rollout"`; `view="heatmap"` (a text's only view) draws the query × key heatmap."""
    if result.is_image and view != "heatmap":
        if view == "rollout":
            return patch_rollout(result, **kwargs)
        return layer_overlays(result, layer, **kwargs) if head is None else patch_overlay(result, layer, head, **kwargs)
    if head is None:
        raise TypeError("plot(amap, layer=, head=): give the head to draw")
    return attention_heatmap(result, layer, head, **kwargs)


@plot.register(HeadScores)
def _plot_scores(result: HeadScores, *, metric: str, **kwargs: Any) -> Figure:
    return score_grid(result, metric, **kwargs)


@plot.register(Verification)
def _plot_verification(result: Verification, **kwargs: Any) -> Figure:
    return verification_plot(result, **kwargs)


@plot.register(DLAResult)
def _plot_dla(result: DLAResult, **kwargs: Any) -> Figure:
    return dla_grid(result, **kwargs)


@plot.register(PatchResult)
def _plot_patch(result: PatchResult, **kwargs: Any) -> Figure:
    return patch_grid(result, **kwargs)


@plot.register(ProbeResult)
def _plot_probe(result: ProbeResult, **kwargs: Any) -> Figure:
    return probe_grid(result, **kwargs)


# ---------------------------------------------------------------- the report's figures


@dataclass(frozen=True)
class Panel:
    """One figure to draw: the arguments of its spec's `draw`, the words that fill its file stem and
    caption, and the result it shows (a report places a probe's figures beside that probe)."""

    args: tuple
    words: Mapping[str, Any]
    result: Any = None


@dataclass(frozen=True)
class FigureSpec:
    """A figure of the report. `source` names the field of a model's analysis (`reports.analysis.ModelAnalysis`)
    it draws; `panels(section)` lists what to draw from it (nothing when the field is empty); `stem`
    and `caption` are format strings over each panel's words; `group` is the report section showing it."""

    name: str
    source: str
    group: Literal["verification", "heads", "probe", "attention", "syntax", "syntax-grid", "comparison", "sinks",
                   "mechanisms", "vision"]
    draw: Callable[..., Figure]
    panels: Callable[[Any], Iterable[Panel]]
    stem: str
    caption: str


def _verification_panels(section: Any) -> Iterable[Panel]:
    if section.verification is not None:
        yield Panel((section.verification,), {}, section.verification)


def _score_panels(section: Any) -> Iterable[Panel]:
    if section.scores is not None:
        for metric in plotted_metrics(section.scores):
            yield Panel((section.scores, metric), {"metric": metric, "label": section.scores.registry[metric].label},
                        section.scores)


def _probe_panels(section: Any) -> Iterable[Panel]:
    no_attention = tuple(getattr(section.scores, "no_attention", ()))  # a hybrid stack's layers without attention
    for probe in section.probes:
        yield Panel((probe, no_attention), {"task": probe.task, "file_task": slug(probe.task), "n": probe.n}, probe)


def _drilldown_panels(section: Any) -> Iterable[Panel]:
    for panel in _probe_panels(section):
        probe = panel.result
        if probe.best_head is not None and len(probe.examples):
            yield Panel((probe,), panel.words, probe)  # the drilldown draws the best head's examples only


def _heatmap_panels(section: Any) -> Iterable[Panel]:
    layer, head = start_head(section)
    kind = f"{STACKS['encoder']} · " if section.pairs else ""  # an encoder–decoder's maps are its encoder's
    for i, amap in enumerate(section.heatmap_maps):
        yield Panel((amap, layer, head), {"i": i, "head": head_name(layer, head), "layer_id": layer, "head_id": head,
                                          "text": amap.text, "level": amap.level, "kind": kind}, amap)


# The attention maps of an encoder–decoder model, named once: the report's explorer and figure captions use these.
STACKS: Mapping[str, str] = {"encoder": "Encoder self-attention", "decoder": "Decoder self-attention",
                             "cross": "Cross-attention (target → source)"}


def _seq2seq_panels(section: Any) -> Iterable[Panel]:
    """The decoder's self-attention and the cross-attention of each (source, target) pair, at the
    heatmaps' level, on the start head (or the stack's first head where it has no such head)."""
    layer, head = start_head(section)
    words = bool(section.heatmap_maps) and section.heatmap_maps[0].level == "word"
    pairs = section.word_pairs if words and section.word_pairs else section.pairs
    for i, pair in enumerate(pairs):
        for kind in ("decoder", "cross"):
            amap = getattr(pair, kind)
            lay = layer if layer in amap.layer_ids else amap.layer_ids[0]
            hd = head if head in amap.head_ids else amap.head_ids[0]
            yield Panel((amap, lay, hd), {"i": i, "kind": kind, "stack": STACKS[kind], "head": head_name(lay, hd),
                                          "layer_id": lay, "head_id": hd, "text": pair.encoder.text,
                                          "target": pair.decoder.text, "level": amap.level}, amap)


def _token_map_panels(kind: TokenMap):
    def panels(section: Any) -> Iterable[Panel]:
        for i, amap in enumerate(section.maps):  # token level: every layer of the whole text
            if kind != "flow" or flow_fits(amap.attention):
                yield Panel((amap, kind), {"i": i, "text": amap.text}, amap)
    return panels


def _mosaic_panels(section: Any) -> Iterable[Panel]:
    if section.maps:
        yield Panel((section.maps[0],), {"text": section.maps[0].text}, section.maps)  # the first of the sentences


def _image_maps(section: Any) -> list:
    return [m for m in section.maps if m.is_image]


def _overlay_panels(section: Any) -> Iterable[Panel]:
    """Each image: the start head's attention from [CLS] (the first patch where there is none) over the image."""
    layer, head = start_head(section)
    for i, amap in enumerate(_image_maps(section)):
        yield Panel((amap, layer, head), {"i": i, "head": head_name(layer, head), "from": amap.labels[0],
                                          "text": amap.text}, amap)


def _layer_overlay_panels(section: Any) -> Iterable[Panel]:
    """The first image: every head of the start head's layer."""
    maps = _image_maps(section)
    if maps:
        layer, _ = start_head(section)
        yield Panel((maps[0], layer), {"layer": layer, "from": maps[0].labels[0], "text": maps[0].text}, maps[0])


def _patch_rollout_panels(section: Any) -> Iterable[Panel]:
    for i, amap in enumerate(_image_maps(section)):
        yield Panel((amap,), {"i": i, "from": amap.labels[0], "text": amap.text}, amap)


def _comparison_panels(section: Any) -> Iterable[Panel]:
    comparison = getattr(section, "comparison", None)
    for metric in dict.fromkeys(comparison.table["metric"]) if comparison is not None else ():
        yield Panel((comparison, metric), {"metric": metric, "a": comparison.a, "b": comparison.b,
                                           "label": METRICS[metric].label if metric in METRICS else metric},
                    comparison)


def _direction_slug(direction: str) -> str:
    return slug(direction.replace("->", "-to-"))  # dependent-to-head


def _relation_bar_panels(section: Any) -> Iterable[Panel]:
    result = getattr(section, "syntax", None)
    for direction in dict.fromkeys(r.direction for r in result.relations) if result is not None else ():
        if any(r.direction == direction and r.best_head is not None for r in result.relations):
            yield Panel((result, direction), {"direction": direction, "file_direction": _direction_slug(direction)}, result)


def _relation_grid_panels(section: Any) -> Iterable[Panel]:
    result = getattr(section, "syntax", None)
    for r in result.relations if result is not None else ():
        if r.best_head is not None:
            yield Panel((result, r.relation, r.direction), {"direction": r.direction, "relation": r.relation, "n": r.n,
                                               "file_relation": slug(r.relation), "file_direction": _direction_slug(r.direction),
                                               "head": head_name(*r.best_head)}, result)


def _tree_panels(section: Any) -> Iterable[Panel]:
    result = getattr(section, "syntax", None)
    trees = result.trees if result is not None else None
    if trees is not None and trees.example is not None and trees.example_heads:
        yield Panel((trees,), {"head": head_name(*trees.best_head), "text": trees.example.text}, result)


def _cluster_panels(section: Any) -> Iterable[Panel]:
    clusters = getattr(section, "syntax_clusters", None)
    if clusters is not None and len(clusters):
        yield Panel((clusters,), {"n": len(clusters)}, getattr(section, "syntax", None))


def _sink_panels(section: Any) -> Iterable[Panel]:
    report = getattr(section, "sinks", None)
    if report is not None:
        yield Panel((report,), {"epsilon": report.sink_rate.epsilon}, report)


def _streaming_panels(section: Any) -> Iterable[Panel]:
    result = getattr(section, "streaming", None)
    if result is not None:
        yield Panel((result,), {"n": result.n_tokens, "window": result.window, "keep": result.keep}, result)


def _dla_panels(section: Any) -> Iterable[Panel]:
    found = getattr(section, "mechanisms", None)
    for i, r in enumerate(found.dla if found is not None else ()):
        yield Panel((r,), {"i": i, "text": r.prompt, "answer": r.answer.strip() or repr(r.answer),
                           "total": r.total, "err": r.identity_abs_err}, found)


MECHANISMS_EDGES = 25  # composition edges drawn (the strongest; the CSV keeps more)


def _composition_panels(section: Any) -> Iterable[Panel]:
    found = getattr(section, "mechanisms", None)
    if found is not None and found.composition is not None:  # K-composition: the one induction heads are made of
        yield Panel((found.composition, "k", MECHANISMS_EDGES), {"kind": "k", "kind_name": "K", "k": MECHANISMS_EDGES},
                    found)


def _mechanisms_patch_panels(section: Any) -> Iterable[Panel]:
    found = getattr(section, "mechanisms", None)
    if found is not None and found.patching is not None:
        yield Panel((found.patching,), {"pair_set": found.pair_set, "n": len(found.patching.pairs)}, found)


def _composition_figure(scores: Any, kind: str, k: int) -> Figure:
    return composition_graph(scores, kind=kind, k=k)


FIGURES: Mapping[str, FigureSpec] = {spec.name: spec for spec in (
    FigureSpec("verification", "verification", "verification", verification_plot, _verification_panels,
               "verification",
               "Max |Δ| per layer between the model's attention and the from-scratch recomputation (log scale)."),
    FigureSpec("head_scores", "scores", "heads", score_grid, _score_panels,
               "heads-{metric}", "{label}: one cell per head, the top heads boxed."),
    FigureSpec("probe_grid", "probes", "probe", probe_grid, _probe_panels,
               "probe-{file_task}-grid", "{task}: accuracy of every head over all {n} examples; the selected head boxed."),
    FigureSpec("probe_drilldown", "probes", "probe", probe_drilldown, _drilldown_panels,
               "probe-{file_task}-drilldown", "{task}: the selected head's attention from the source word to each candidate."),
    FigureSpec("attention", "maps", "attention", attention_heatmap, _heatmap_panels,
               "attention-{i}-{head}", "{kind}Layer {layer_id}, head {head_id} on “{text}” ({level} level)."),
    FigureSpec("seq2seq_attention", "pairs", "attention", attention_heatmap, _seq2seq_panels,
               "attention-{i}-{kind}-{head}",
               "{stack} · layer {layer_id}, head {head_id}: target “{target}”, source “{text}” ({level} level)."),
    FigureSpec("attention_mosaic", "maps", "attention", attention_mosaic, _mosaic_panels,
               "model-view", "Every head on “{text}” (token level), one small heatmap per head."),
    FigureSpec("rollout", "maps", "attention", token_map, _token_map_panels("rollout"),
               "rollout-{i}", "Attention rollout (Abnar & Zuidema 2020) on “{text}”: how much of each output token "
               "(row) comes from each input token (column), heads averaged, the residual as 0.5·A + 0.5·I."),
    FigureSpec("flow", "maps", "attention", token_map, _token_map_panels("flow"),
               "flow-{i}", "Attention flow (Abnar & Zuidema 2020) on “{text}”: the max-flow from each output token "
               "(row) to each input token (column) through the layers, rows normalised (drawn when layers × "
               f"tokens² ≤ {FLOW_MAX_EDGES:,} and it takes at most {FLOW_MAX_SECONDS:g} s; the notes name a text "
               "whose flow was not drawn)."),
    FigureSpec("syntax_relations", "syntax", "syntax", relation_bars, _relation_bar_panels,
               "syntax-{file_direction}",
               "{direction}: per relation, the head chosen on the selection sentences, its test accuracy (95% "
               "Wilson interval) beside the best fixed offset's."),
    FigureSpec("syntax_tree", "syntax", "syntax", tree_figure, _tree_panels,
               "syntax-tree", "The gold tree of “{text}” above, the tree decoded from {head} below."),
    FigureSpec("syntax_clusters", "syntax_clusters", "syntax", cluster_plot, _cluster_panels,
               "syntax-clusters", "All {n} heads placed by the Jensen-Shannon distance between their attention "
                                  "(metric MDS), coloured by layer, labelled by each head's top role."),
    FigureSpec("comparison_grid", "comparison", "comparison", difference_grid, _comparison_panels,
               "compare-{metric}", "{label}: {b} minus {a} per head, the changed heads boxed."),
    FigureSpec("syntax_grid", "syntax", "syntax-grid", relation_grid, _relation_grid_panels,
               "syntax-grid-{file_relation}-{file_direction}",
               "{relation} ({direction}, n={n}): test accuracy of every head; {head}, chosen on the selection "
               "sentences, boxed."),
    FigureSpec("patch_overlay", "maps", "vision", patch_overlay, _overlay_panels,
               "vision-{i}-{head}", "{head}'s attention from {from} onto the patches of “{text}”, over the image "
               "as the model saw it (the query patch outlined where it is one)."),
    FigureSpec("layer_overlays", "maps", "vision", layer_overlays, _layer_overlay_panels,
               "vision-layer-{layer}", "Every head of layer {layer} on “{text}”: attention from {from} onto the patches."),
    FigureSpec("patch_rollout", "maps", "vision", patch_rollout, _patch_rollout_panels,
               "vision-rollout-{i}", "Attention rollout (Abnar & Zuidema 2020) from {from} onto the patches of "
               "“{text}”: heads averaged, the residual as 0.5·A + 0.5·I, through every layer."),
    FigureSpec("sink_shares", "sinks", "sinks", sink_share_grid, _sink_panels,
               "sinks-shares", "Every head's attention on position 0; sink heads (share > {epsilon:g}) marked by what "
                               "ablating them shows: ○ dormant, ● active."),
    FigureSpec("massive_activations", "sinks", "sinks", massive_figure, _sink_panels,
               "sinks-massive", "The largest residual-stream activation of each layer beside the layer's median; "
                                "massive ones (|a| > 100 and > 1000 × the median, Sun et al. 2024) labelled."),
    FigureSpec("streaming", "streaming", "sinks", streaming_figure, _streaming_panels,
               "sinks-streaming", "Next-token loss against position on {n} tokens: dense attention, a window of "
                                  "{window} keys, and the window plus the first {keep} tokens (StreamingLLM)."),
    FigureSpec("mechanisms_dla", "mechanisms", "mechanisms", dla_grid, _dla_panels,
               "mechanisms-dla-{i}", "Direct logit attribution of the next token “{answer}” after “{text}”: each head's "
                                     "write at the last position through the frozen final norm onto the unembedding "
                                     "(logit {total:.3f}; the parts sum back to it within {err:.0e})."),
    FigureSpec("mechanisms_composition", "mechanisms", "mechanisms", _composition_figure, _composition_panels,
               "mechanisms-composition-{kind}", "The {k} strongest {kind_name}-composition edges (Elhage et al. 2021) "
                                                "between heads, from the weights alone, by the ratio to random "
                                                "matrices of the same shapes (Q and V: mechanisms_composition.csv)."),
    FigureSpec("mechanisms_patching", "mechanisms", "mechanisms", patch_grid, _mechanisms_patch_panels,
               "mechanisms-patching", "Head-output patching (denoising) on {n} pairs of the built-in {pair_set} set: "
                                      "the logit difference with each head's clean output patched into the corrupt "
                                      "run, normalised (0 = corrupt, 1 = clean)."),
)}


def plotted_metrics(scores: Any) -> list[str]:
    """Metrics with at least one finite value (the rest are listed as not applicable)."""
    finite = scores.table.groupby("metric", sort=False)["value"].apply(lambda v: v.notna().any())
    return [m for m in scores.metrics if bool(finite.get(m, False))]


def start_head(section: Any) -> tuple[int, int]:
    """The head shown first: the probe's selected head, else the top previous-token head, else the
    most confident one, else the map's first head."""
    for probe in section.probes:
        if probe.best_head is not None:
            return int(probe.best_head[0]), int(probe.best_head[1])
    if section.scores is not None:
        for metric in ("previous_token", "max_weight"):
            top = section.scores.top(metric, k=1) if metric in section.scores.metrics else None
            if top is not None and len(top):
                return int(top["layer"].iloc[0]), int(top["head"].iloc[0])
    if section.maps:
        return section.maps[0].layer_ids[0], section.maps[0].head_ids[0]
    return 0, 0


SLUG_MAX = 60  # characters (ASCII: bytes) of a slug, so that every file name of a report stays far below 255 bytes


def slug(text: str) -> str:
    """A file-name-safe form of a model name or task, at most `SLUG_MAX` characters: a longer one keeps its
    start and ends in a hash of the whole text, so different texts keep different slugs.

    >>> slug("HuggingFaceTB/SmolLM2-135M"), slug("../my model")
    ('HuggingFaceTB-SmolLM2-135M', 'my-model')
    >>> len(slug("/data/" + "checkpoints/" * 40 + "step-1000"))
    60
    """
    s = re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-.") or "model"
    if len(s) <= SLUG_MAX:
        return s
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:12]
    return f"{s[:SLUG_MAX - len(digest) - 1].rstrip('-.')}-{digest}"
