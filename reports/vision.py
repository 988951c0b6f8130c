"""The report's Vision section (image inputs): attention drawn over the image, patch by patch.

Each figure takes an `AttentionMap` of an image (`amap.grid`, `amap.positions`, `amap.image`), never a
model, and returns a new `ReportFigure` (`reports.canvas`); the report draws them through
`reports.panels.FIGURES`, the notebook through `hs.plot`. The attention of one query row onto the
patch keys is reshaped to the patch grid and laid over the picture the model saw (its attention to
[CLS] and the registers, which have no place on the grid, is given in the title).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from headscope.analyses.flow import rollout
from headscope.probe.types import AttentionMap, head_name, position

from .canvas import new_figure, report_figure
from .fonts import font_context

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["patch_overlay", "layer_overlays", "patch_rollout", "grid_of_row", "query_unit"]


def _check(amap: AttentionMap) -> None:
    if not amap.is_image:
        raise ValueError("patch overlays draw the map of an image (extract(lm, images=[...])); this map is a text's")


def query_unit(amap: AttentionMap, query: int | tuple[int, int] | None = None) -> int:
    """The unit whose attention row is drawn: `query` as a unit index or a (row, column) patch; by default
    the first special unit ([CLS]), or the first patch of a model without one (SigLIP).

    >>> import torch
    >>> m = AttentionMap(text="img", level="token", labels=("[CLS]", "r0c0", "r0c1"), spans=((0, 0),) * 3,
    ...                  special=(True, False, False), attention=torch.full((1, 1, 3, 3), 1 / 3), causal=False,
    ...                  grid=(1, 2))
    >>> query_unit(m), query_unit(m, (0, 1))
    (0, 2)
    """
    if query is None:
        return 0
    if isinstance(query, tuple):
        if query not in amap.positions:
            raise ValueError(f"no patch {query} on the {amap.grid[0]} x {amap.grid[1]} grid")
        return amap.positions.index(query)
    if not 0 <= int(query) < len(amap):
        raise ValueError(f"query {query} out of range: the map has units 0..{len(amap) - 1}")
    return int(query)


def grid_of_row(row: np.ndarray, amap: AttentionMap) -> np.ndarray:
    """One row of weights over the map's units -> `[rows, cols]` over its patches (special keys dropped).

    >>> import torch
    >>> m = AttentionMap(text="img", level="token", labels=("[CLS]", "r0c0", "r0c1"), spans=((0, 0),) * 3,
    ...                  special=(True, False, False), attention=torch.full((1, 1, 3, 3), 1 / 3), causal=False,
    ...                  grid=(1, 2))
    >>> grid_of_row(np.array([0.5, 0.2, 0.3]), m).tolist()
    [[0.2, 0.3]]
    """
    grid = np.zeros(amap.grid)
    for k, pos in enumerate(amap.positions):
        if pos is not None:
            grid[pos] = row[k]
    return grid


def _overlay(ax, amap: AttentionMap, weights: np.ndarray, *, query: int, cmap: str, title: str) -> None:
    h, w = amap.image.shape[:2] if amap.image is not None else amap.grid
    if amap.image is not None:
        ax.imshow(amap.image, extent=(0, w, h, 0))
    ax.imshow(weights, cmap=cmap, alpha=0.6, extent=(0, w, h, 0), interpolation="nearest",
              vmin=0.0, vmax=max(float(weights.max()), 1e-12))
    pos = amap.positions[query]
    if pos is not None:  # the query patch, outlined
        from matplotlib.patches import Rectangle

        ph, pw = h / amap.grid[0], w / amap.grid[1]
        ax.add_patch(Rectangle((pos[1] * pw, pos[0] * ph), pw, ph, fill=False, edgecolor="red", linewidth=1.5))
    ax.set_xticks([])
    ax.set_yticks([])
    ax.set_title(title, fontsize=9)


def _special_share(amap: AttentionMap, row: np.ndarray) -> str:
    shares = [f"{lab} {row[k]:.2f}" for k, lab in enumerate(amap.labels) if amap.special[k]]
    return ("; " + ", ".join(shares[:3]) + (" …" if len(shares) > 3 else "")) if shares else ""


def patch_overlay(amap: AttentionMap, layer: int, head: int, *, query: int | tuple[int, int] | None = None,
                  ax: Axes | None = None, cmap: str = "inferno") -> Figure:
    """One head's attention from [CLS] (or from `query`: a unit index or a (row, column) patch) onto the
    patches, as a heatmap over the image; the query patch outlined in red."""
    _check(amap)
    q = query_unit(amap, query)
    li, hi = position(amap.layer_ids, layer, "layer"), position(amap.head_ids, head, "head")
    row = amap.attention[li, hi, q].detach().float().cpu().numpy()
    with font_context(amap.text):
        fig, ax = new_figure(4.0, 4.2, ax)
        _overlay(ax, amap, grid_of_row(row, amap), query=q, cmap=cmap,
                 title=f"{head_name(layer, head)} from {amap.labels[q]}{_special_share(amap, row)}")
    return fig


def layer_overlays(amap: AttentionMap, layer: int, *, query: int | tuple[int, int] | None = None,
                   cmap: str = "inferno") -> Figure:
    """Every head of one layer as an overlay (attention from [CLS] or `query`), one panel per head."""
    _check(amap)
    q = query_unit(amap, query)
    li = position(amap.layer_ids, layer, "layer")
    heads = list(amap.head_ids)
    cols = min(len(heads), 4)
    rows = -(-len(heads) // cols)
    with font_context(amap.text):
        fig = report_figure(2.4 * cols, 2.5 * rows + 0.4)
        axes = fig.subplots(rows, cols, squeeze=False)
        for ax in axes.flat[len(heads):]:
            ax.axis("off")
        for ax, (hi, head) in zip(axes.flat, enumerate(heads)):
            row = amap.attention[li, hi, q].detach().float().cpu().numpy()
            _overlay(ax, amap, grid_of_row(row, amap), query=q, cmap=cmap, title=head_name(layer, head))
        fig.suptitle(f"layer {layer}: every head from {amap.labels[q]}", fontsize=11)
    return fig


def patch_rollout(amap: AttentionMap, *, query: int | tuple[int, int] | None = None, ax: Axes | None = None,
                  cmap: str = "inferno") -> Figure:
    """Attention rollout (Abnar & Zuidema 2020, `analyses.flow.rollout`: heads averaged, 0.5·A + 0.5·I,
    multiplied through the layers) from [CLS] (or `query`) onto the patches, over the image."""
    _check(amap)
    q = query_unit(amap, query)
    row = rollout(amap.attention.detach().float().cpu()).numpy()[q]  # [key]
    with font_context(amap.text):
        fig, ax = new_figure(4.0, 4.2, ax)
        _overlay(ax, amap, grid_of_row(row, amap), query=q, cmap=cmap,
                 title=f"rollout from {amap.labels[q]}{_special_share(amap, row)}")
    return fig
