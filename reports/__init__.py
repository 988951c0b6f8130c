"""reports: figures, the offline HTML report and notebook views of headscope results.

`plot(result, **kw)` draws any result: an `AttentionMap` (`layer=`, `head=`), a `HeadScores`
(`metric=`), a `Verification` or a `ProbeResult`. Submodules (imported on use, so
`import headscope.reports` costs nothing):
- `reports.figures`: matplotlib figures of attention maps, head scores, probes and verification,
  and `FIGURES`, the registry of the report's figures;
- `reports.fonts`: fonts that draw CJK, Arabic and emoji labels as glyphs;
- `reports.html`: `build_report(...)` -> one self-contained, offline `index.html` plus PNGs and CSVs;
- `reports.notebook`: bertviz views and tables for Jupyter.
"""

from __future__ import annotations

from typing import Any

__all__ = ["plot"]


def plot(result: Any, **kwargs: Any):
    """The figure of `result` (a matplotlib Figure): see `reports.figures.plot`."""
    from .figures import plot as _plot

    return _plot(result, **kwargs)
