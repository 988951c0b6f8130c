"""The two heatmaps the figures are made of: a token × token map and a layer × head grid.

`token_heatmap` draws a `[query, key]` map over a text's units, a label on every row and column, a causal
map's unseen triangle grey; its size is bounded whatever the text's length (`CELLS_MAX`, `SIDE_MAX`,
`LABELS_MAX`: a long text is drawn as block means, `analyses.pooled.block_means`). `grid_heatmap` draws one
cell per (layer, head) in a `grid_figure` with fixed margins; `outline_heads` boxes chosen heads and
`label_no_attention` names the rows of a hybrid stack's layers without softmax attention (`NO_ATTENTION`).
The plots of `reports.figures` are built from these; nothing here knows a result type.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Sequence

import numpy as np

from headscope.analyses.pooled import block_means
from headscope.probe.types import position

from .canvas import new_figure, report_figure
from .fonts import font_context

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from headscope.probe.types import AttentionMap

__all__ = [
    "display_label",
    "token_heatmap",
    "CELLS_MAX",
    "SIDE_MAX",
    "LABELS_MAX",
    "grid_heatmap",
    "grid_figure",
    "outline_heads",
    "NO_ATTENTION",
    "with_no_attention_rows",
    "label_no_attention",
]

_MASKED = "#eeeeee"  # cells a causal model cannot attend to


def display_label(label: str) -> str:
    """A token as a readable axis label: whitespace made visible, never empty.

    >>> display_label("\\n"), display_label(" "), display_label("Ġthe")
    ('↵', '␣', 'Ġthe')
    """
    shown = label.replace("\n", "↵").replace("\t", "⇥").replace("\r", "")
    return shown if shown.strip() else "␣"


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


# A token heatmap's size is bounded whatever the text's length: at most CELLS_MAX cells per axis (a longer text
# is drawn as a pooled overview, each cell the mean over a block of units), at most SIDE_MAX inches per side, and
# at most LABELS_MAX tick labels per axis (every k-th unit's label beyond that).
CELLS_MAX = 256
SIDE_MAX = 20.0
LABELS_MAX = 80


def token_heatmap(weights: np.ndarray, amap: AttentionMap, *, ax: Axes | None, cmap: str, cbar: str,
                  title: str, xlabel: str = "key (attended to)", ylabel: str = "query (attending)",
                  vmin: float = 0.0, vmax: float = 1.0) -> Figure:
    """A [query, key] map over `amap`'s units, a label on every row and column; a causal map's upper triangle grey.
    A cross-attention map's rows are the target's units and its columns the source's. The colours run from
    `vmin` to `vmax` (0 to 1: every weight on one scale; a narrower range, stated by the caller, shows the structure
    of a map whose weights are all alike).

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
    drawn = block_means(values, block)
    m_q, m = drawn.shape
    cell = min(_cell(max(m, m_q)), SIDE_MAX / max(m, m_q))
    step = -(-max(m, m_q) // LABELS_MAX)
    notes = ([f"pooled {block}×{block}"] if block > 1 else []) + ([f"a label every {step * block} units"] if step > 1 else [])
    full_title = f"{title} · {', '.join(notes)}" if notes else title
    colours = mpl.colormaps[cmap].with_extremes(bad=_MASKED)
    with font_context("".join(rows + labels) + str(title or "") + str(amap.meta.get("model", ""))):
        fig, ax = new_figure(m * cell + 2.4, m_q * cell + 1.4, ax)
        ax.set_facecolor(_MASKED)
        mesh = ax.pcolormesh(np.ma.masked_invalid(drawn), cmap=colours, vmin=vmin, vmax=vmax)
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


# ---------------------------------------------------------------- layer x head grids


def grid_heatmap(ax: Axes, grid: pd.DataFrame, *, vmin: float, vmax: float, cmap: str, center: float | None,
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
    by `label_no_attention` as a labelled row, so L3 of the model stays L3 and is never a row of zeros.

    >>> import pandas as pd
    >>> g = pd.DataFrame([[0.5, 0.2]], index=pd.Index([1], name="layer"), columns=[0, 1])
    >>> with_no_attention_rows(g, (0, 2)).index.tolist()
    [0, 1, 2]
    """
    if not no_attention:
        return grid
    return grid.reindex(sorted(set(grid.index) | set(no_attention))).rename_axis(grid.index.name)


def label_no_attention(ax: Axes, rows: Sequence[int], no_attention: Sequence[int], n_cols: int) -> None:
    """Hatch each row of a layer without softmax attention and write so across it (row order = `rows`)."""
    from matplotlib.patches import Rectangle

    for layer in no_attention:
        if layer not in rows:
            continue
        r = position(rows, layer, "layer")
        ax.add_patch(Rectangle((-0.5, r - 0.5), n_cols, 1, facecolor="white", edgecolor="#999999", hatch="///",
                               lw=0.6, zorder=3))
        ax.text((n_cols - 1) / 2, r, f"L{layer}: {NO_ATTENTION}", ha="center", va="center", fontsize=7,
                color="#444444", zorder=5, bbox=dict(facecolor="white", edgecolor="none", pad=1.0))


def outline_heads(ax: Axes, grid: pd.DataFrame, cells: Sequence[tuple[int, int]], colour: str = "#d62728") -> None:
    """Box the (layer, head) cells, the grid's index/columns being model indices."""
    from matplotlib.patches import Rectangle

    rows, cols = list(grid.index), list(grid.columns)
    for rank, (layer, head) in enumerate(cells):
        if layer in rows and head in cols:
            r, c = position(rows, layer, "layer"), position(cols, head, "head")
            ax.add_patch(Rectangle((c - 0.5, r - 0.5), 1, 1, fill=False, edgecolor=colour,
                                   lw=2.6 if rank == 0 else 1.6, clip_on=False, zorder=4))  # above the grid lines


def _grid_size(grid: pd.DataFrame) -> tuple[float, float]:
    n_l, n_h = grid.shape
    return min(14.0, 2.2 + 0.62 * n_h), min(16.0, 1.6 + (0.42 if n_l <= 12 else 0.3) * n_l)


def grid_figure(grid: pd.DataFrame, ax: Axes | None) -> tuple[Figure, Axes]:
    """A figure for a grid with fixed margins (inches), unless the caller gave the axes."""
    if ax is not None:
        return ax.figure, ax
    w, h = _grid_size(grid)
    fig = report_figure(w, h, layout=None)
    fig.subplots_adjust(left=0.75 / w, right=1 - 0.1 / w, bottom=0.55 / h, top=1 - 0.62 / h)
    return fig, fig.add_subplot()
