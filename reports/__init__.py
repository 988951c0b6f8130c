"""reports: figures, the offline HTML report and notebook views of headscope results.

Submodules (imported on use, so `import headscope.reports` costs nothing):
- `reports.figures`: matplotlib figures of attention maps, head scores, probes and verification;
- `reports.fonts`: fonts that draw CJK, Arabic and emoji labels as glyphs;
- `reports.html`: `build_report(...)` -> one self-contained, offline `index.html` plus PNGs and CSVs;
- `reports.notebook`: bertviz views and tables for Jupyter.
"""

__all__: list[str] = []
