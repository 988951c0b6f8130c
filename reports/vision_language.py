"""The report's Vision–language section: where the words of a vision–language decoder look in the picture.

Each figure takes an `AttentionMap` whose units include image tokens (`amap.patches`, `amap.pictures`), never
a model, and returns a new `ReportFigure` (`reports.canvas`); the report draws them through
`reports.panels.FIGURES`, the notebook through `hs.plot`. One text token's row of attention is put back on
each view's grid (`analyses.vision_language.view_grids`) and drawn over the picture at the view's place
(its cells' boxes): tiles on their part of the picture, a thumbnail over the whole. Views that overlap (a
thumbnail and its tiles) go to panels of their own. `vision_language_tables` are the section's CSV tables.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

import numpy as np
import pandas as pd

from headscope.analyses.vision_language import (ViewGrid, cross_attention_heads, cross_attention_reads, image_rollout,
                                                image_units, patch_grids, text_query, view_grids,
                                                vision_language_heads, visual_sinks)
from headscope.probe.types import AttentionMap, ImageCrossAttention, head_name, position

from .canvas import new_figure, report_figure
from .fonts import font_context

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["image_overlay", "image_mosaic", "image_rollout_figure", "panel_groups", "vision_language_tables",
           "MOSAIC_MAX", "cross_overlay", "cross_head", "cross_tables"]

MOSAIC_MAX = 12  # layers (and heads) a report's mosaic draws at most, evenly spaced


def panel_groups(grids: Sequence[ViewGrid]) -> list[list[ViewGrid]]:
    """The views of each picture in panels: a view joins the first panel of its picture where it overlaps no
    view already there (a picture's tiles share a panel, its thumbnail gets the next).

    >>> g = lambda view, ext: ViewGrid(0, view, np.zeros((1, 1)), np.zeros((1, 1), int), ext)
    >>> [[v.view for v in p] for p in panel_groups([g("tile 0,0", (0, 0, 1, .5)), g("tile 0,1", (0, .5, 1, 1)),
    ...                                              g("thumbnail", (0, 0, 1, 1))])]
    [['tile 0,0', 'tile 0,1'], ['thumbnail']]
    """
    panels: list[list[ViewGrid]] = []
    for grid in grids:
        for panel in panels:
            if panel[0].image == grid.image and not any(_overlap(grid.extent, other.extent) for other in panel):
                panel.append(grid)
                break
        else:
            panels.append([grid])
    return panels


def _overlap(a: tuple[float, ...], b: tuple[float, ...]) -> bool:
    eps = 1e-9
    return a[0] < b[2] - eps and b[0] < a[2] - eps and a[1] < b[3] - eps and b[1] < a[3] - eps


def _picture(amap: AttentionMap, image: int) -> np.ndarray | None:
    return amap.pictures[image] if image < len(amap.pictures) and amap.pictures[image] is not None else None


def cross_head(pairs: Sequence[ImageCrossAttention]) -> tuple[int, int]:
    """The cross-attention head a report shows: the one whose reading rows are most focused on the picture's
    cells (the lowest `image_entropy` of `analyses.vision_language.cross_attention_heads`)."""
    frame = cross_attention_heads(pairs)
    if not len(frame) or not frame["image_entropy"].notna().any():
        return pairs[0].cross.layer_ids[0], pairs[0].cross.head_ids[0]
    best = frame.loc[frame["image_entropy"].idxmin()]
    return int(best["layer"]), int(best["head"])


def cross_overlay(pair: ImageCrossAttention, layer: int, head: int, *, query: int | str | None = None,
                  ax: Axes | None = None, cmap: str = "inferno") -> Figure:
    """One cross-attention head's attention from a text token (`query`: a unit index or a label; by default the
    last text token the mask lets read the image) over the image keys, drawn over the picture where each key's
    cell sits (each tile on its part of the picture)."""
    cross = pair.cross
    reads = cross.meta.get("reads_image") or [True] * len(cross.queries)
    if query is None:
        candidates = [q for q in range(len(cross.queries)) if reads[q] and not cross.queries.special[q]]
        q = candidates[-1] if candidates else len(cross.queries) - 1
    else:
        q = text_query(pair.decoder, query)
    li, hi = position(cross.layer_ids, layer, "layer"), position(cross.head_ids, head, "head")
    row = cross.attention[li, hi, q].detach().float().cpu().numpy()
    panels = panel_groups(patch_grids(cross.keys.patches, row))
    cells = float(sum(row[k] for k, p in enumerate(cross.keys.patches) if p is not None))
    title = f"{head_name(layer, head)} (cross) from “{cross.queries.labels[q]}” · {cells:.2f} on the cells"
    several = len({p[0].image for p in panels}) > 1
    with font_context(pair.text):
        if ax is not None or len(panels) == 1:
            fig, axis = new_figure(4.0, 4.2, ax)
            axes, panels = [axis], panels[:1]
        else:
            cols = min(len(panels), 3)
            fig = report_figure(3.4 * cols, 3.5 * -(-len(panels) // cols) + 0.4)
            grid = fig.subplots(-(-len(panels) // cols), cols, squeeze=False)
            for extra in grid.flat[len(panels):]:
                extra.axis("off")
            axes = list(grid.flat)
            fig.suptitle(title, fontsize=10)
        for axis, panel in zip(axes, panels):  # no query cell to outline: the query is a text token (-2: none)
            _draw_panel(axis, pair.decoder, panel, query=-2, cmap=cmap,
                        title=title if len(axes) == 1 else _panel_name(panel, several) or title)
    return fig


def cross_tables(pairs: Sequence[ImageCrossAttention]) -> dict[str, pd.DataFrame]:
    """The CSV tables of a cross-attention reader's section: every cross head's focus on the picture
    (`cross_attention_heads`) and, in the head the report shows, which text token reads which image cell."""
    layer, head = cross_head(pairs)
    reads = pd.concat([cross_attention_reads(p, layer, head).assign(i=i) for i, p in enumerate(pairs)],
                      ignore_index=True)
    return {"cross_attention_heads": cross_attention_heads(pairs),
            "cross_attention_reads": reads.assign(head_name=head_name(layer, head))}


def _draw_panel(ax: Axes, amap: AttentionMap, panel: list[ViewGrid], *, query: int, cmap: str, title: str,
                index: tuple = ()) -> None:
    """The panel's views over their picture (`values[index]` of each), one colour scale for the panel; the query's
    own cell outlined in red where it is an image token of this panel."""
    from matplotlib.patches import Rectangle

    picture = _picture(amap, panel[0].image)
    h, w = (picture.shape[:2] if picture is not None else (1.0, 1.0))
    if picture is not None:
        ax.imshow(picture, extent=(0, w, h, 0))
    values = [np.asarray(g.values[index], dtype=float) for g in panel]
    top = max([float(np.nanmax(v)) for v in values if np.isfinite(v).any()] + [1e-12])
    for g, v in zip(panel, values):
        t, l, b, r = g.extent
        ax.imshow(np.ma.masked_invalid(v), cmap=cmap, alpha=0.6, extent=(l * w, r * w, b * h, t * h),
                  interpolation="nearest", vmin=0.0, vmax=top)
        if query in g.units:
            box = amap.patches[query].box
            ax.add_patch(Rectangle((box[1] * w, box[0] * h), (box[3] - box[1]) * w, (box[2] - box[0]) * h,
                                   fill=False, edgecolor="red", linewidth=1.5))
    ax.set_xlim(0, w)
    ax.set_ylim(h, 0)
    ax.set_xticks([])
    ax.set_yticks([])
    ax.set_title(title, fontsize=9)


def _panel_name(panel: list[ViewGrid], several: bool) -> str:
    views = [g.view for g in panel if g.view != "base"]
    name = f"image {panel[0].image}" if several else ""
    if views:
        name += (" · " if name else "") + (views[0] if len(views) == 1 else f"{len(views)} tiles")
    return name


def _image_part(amap: AttentionMap, row: np.ndarray) -> float:
    return float(sum(row[i] for i in image_units(amap)))


def _panels_figure(amap: AttentionMap, row: np.ndarray, q: int, *, title: str, cmap: str, ax: Axes | None) -> Figure:
    panels = panel_groups(view_grids(amap, row))
    several = len({p[0].image for p in panels}) > 1
    with font_context(amap.text):
        if ax is not None or len(panels) == 1:
            fig, axis = new_figure(4.0, 4.2, ax)
            axes = [axis]
            panels = panels[:1] if ax is not None else panels
        else:
            cols = min(len(panels), 3)
            fig = report_figure(3.4 * cols, 3.5 * -(-len(panels) // cols) + 0.4)
            grid = fig.subplots(-(-len(panels) // cols), cols, squeeze=False)
            for extra in grid.flat[len(panels):]:
                extra.axis("off")
            axes = list(grid.flat)
        for axis, panel in zip(axes, panels):
            name = _panel_name(panel, several)
            _draw_panel(axis, amap, panel, query=q, cmap=cmap, title=title if len(panels) == 1 else name or title)
        if len(panels) > 1 and ax is None:
            fig.suptitle(title, fontsize=10)
    return fig


def _row(amap: AttentionMap, layer: int, head: int, q: int) -> np.ndarray:
    li, hi = position(amap.layer_ids, layer, "layer"), position(amap.head_ids, head, "head")
    return amap.attention[li, hi, q].detach().float().cpu().numpy()


def image_overlay(amap: AttentionMap, layer: int, head: int, *, query: int | str | None = None,
                  ax: Axes | None = None, cmap: str = "inferno") -> Figure:
    """One head's attention from a text token (`query`: a unit index or a word; by default the last text token)
    onto the image tokens, drawn over each picture at each view's place; the title gives the row's share on
    the image tokens."""
    q = text_query(amap, query)
    row = _row(amap, layer, head, q)
    return _panels_figure(amap, row, q, cmap=cmap, ax=ax,
                          title=f"{head_name(layer, head)} from “{amap.labels[q]}” · {_image_part(amap, row):.2f} "
                                "on the image")


def image_rollout_figure(amap: AttentionMap, *, query: int | str | None = None, ax: Axes | None = None,
                         cmap: str = "inferno") -> Figure:
    """Attention rollout through the decoder (`analyses.vision_language.image_rollout`) from a text token onto
    the image tokens, over each picture."""
    q = text_query(amap, query)
    row = image_rollout(amap, q)
    return _panels_figure(amap, row, q, cmap=cmap, ax=ax,
                          title=f"rollout from “{amap.labels[q]}” · {_image_part(amap, row):.2f} on the image")


def _spaced(ids: Sequence[int], most: int | None) -> list[int]:
    ids = list(ids)
    if most is None or len(ids) <= most:
        return ids
    picks = np.unique(np.linspace(0, len(ids) - 1, most).round().astype(int))
    return [ids[i] for i in picks]


def image_mosaic(amap: AttentionMap, *, query: int | str | None = None, layers: Sequence[int] | None = None,
                 heads: Sequence[int] | None = None, most: int | None = None, cmap: str = "inferno") -> Figure:
    """A layer × head mosaic: each cell one head's attention from the text token `query` over the first picture's
    first panel (its base view, or its tiles), each cell on its own colour scale. `layers` / `heads` (model
    indices) pick the rows and columns; `most` keeps at most that many of each, evenly spaced (the title says so)."""
    q = text_query(amap, query)
    layers = _spaced(amap.layer_ids if layers is None else layers, most)
    heads = _spaced(amap.head_ids if heads is None else heads, most)
    li = [position(amap.layer_ids, l, "layer") for l in layers]
    hi = [position(amap.head_ids, h, "head") for h in heads]
    rows = amap.attention[li][:, hi, q].detach().float().cpu().numpy()  # [layer, head, unit]
    panel = panel_groups(view_grids(amap, rows))[0]
    shown = "" if (len(layers), len(heads)) == (amap.n_layers, amap.n_heads) else \
        f" ({len(layers)} of {amap.n_layers} layers, {len(heads)} of {amap.n_heads} heads)"
    size = 1.5 if max(len(layers), len(heads)) <= 6 else 1.0
    with font_context(amap.text):
        fig = report_figure(size * len(heads) + 0.6, size * len(layers) + 0.7)
        axes = fig.subplots(len(layers), len(heads), squeeze=False)
        for r, layer in enumerate(layers):
            for c, head in enumerate(heads):
                _draw_panel(axes[r, c], amap, panel, query=q, cmap=cmap, title=head_name(layer, head), index=(r, c))
                axes[r, c].title.set_fontsize(7)
        fig.suptitle(f"every head from “{amap.labels[q]}”{shown}", fontsize=10)
    return fig


def vision_language_tables(maps: Sequence[AttentionMap], value_norms: Sequence[Any] = ()) -> dict[str, pd.DataFrame | None]:
    """The section's CSV tables: per head the image share and image-to-text shares (`vision_language_heads`), and
    per text and head its top image tokens by the share of the picture's attention (`visual_sinks`, with the
    value-norm ratio where value norms were given, one `[layer, head, key]` tensor or None per map)."""
    if not maps:
        return {}
    norms = list(value_norms) or [None] * len(maps)
    sinks = [visual_sinks(m, v).assign(text=m.text, i=i) for i, (m, v) in enumerate(zip(maps, norms))]
    frame = pd.concat(sinks, ignore_index=True)
    return {"vision_language_heads": vision_language_heads(maps),
            "visual_sinks": frame[["i", "text", *[c for c in frame.columns if c not in ("i", "text")]]]}
