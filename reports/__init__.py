"""reports: figures, the offline HTML report and notebook views of headscope results.

`plot(result, **kw)` draws any result: an `AttentionMap` (`layer=`, `head=`), a `HeadScores`
(`metric=`), a `Verification` or a `ProbeResult`. Submodules (imported on use, so
`import headscope.reports` costs nothing):
- `reports.figures`: matplotlib figures of attention maps, head scores, probes, mechanisms and
  verification, one per result type, and `plot`; `reports.heatmaps`, the heatmaps they are made of;
- `reports.canvas`: the figure base (`report_figure`, `new_figure`) and files for papers (`save`);
- `reports.panels`: `FIGURES`, the registry of the report's figures;
- `reports.fonts`: fonts that draw CJK, Arabic and emoji labels as glyphs;
- `reports.html`: `build_report(...)` -> one self-contained, offline `index.html` plus PNGs and CSVs;
- `reports.page`, `reports.payload`: what every page is made with (templates, CSP, safe JSON) and the
  one encoder of attention for a page;
- `reports.inline`: `show(maps)`, the head explorer inline in a notebook, offline (also `reports.show`);
  any other result given to `show` is its view from `reports.views`;
- `reports.views`: `VIEWS`, each result type's static notebook HTML (every result's `_repr_html_`);
- `reports.notebook`: bertviz views (they need a CDN) and tables for Jupyter.

`save(fig, "fig.pdf", width="3.5in")` writes any figure as PNG, SVG or PDF (fonts embedded).
"""

from __future__ import annotations

from typing import Any

__all__ = ["plot", "show", "save"]


def plot(result: Any, **kwargs: Any):
    """The figure of `result` (a matplotlib Figure): see `reports.figures.plot`."""
    from .figures import plot as _plot

    return _plot(result, **kwargs)


def show(maps: Any, *args: Any, **kwargs: Any):
    """The offline head explorer of `maps` (or any result's view), inline in a notebook: see `reports.inline.show`."""
    from .inline import show as _show

    return _show(maps, *args, **kwargs)


def save(fig: Any, path: Any, **kwargs: Any):
    """Write a figure as .png, .svg or .pdf by the suffix (`dpi=`, `width="3.5in"`): see `reports.canvas.save`."""
    from .canvas import save as _save

    return _save(fig, path, **kwargs)
