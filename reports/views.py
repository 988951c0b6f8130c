"""Notebook views of results: one HTML fragment per result type, in one registry, `VIEWS`.

A result shows itself in Jupyter, VS Code and Colab through `_repr_html_`; every result type of probe and
analyses inherits that one method (`probe.types.Viewable`), which looks the type up here. `hs.show(x)`
reads the same registry for any result that is not attention (attention maps, lists of them and a
generation open the interactive explorer, `reports.inline`). A view is static HTML, no script: a summary
line and a small table, every text from the result escaped.

To add a view: one function `result -> str` and its entry in `VIEWS`.

>>> from headscope.probe.results import LayerCheck, Verification
>>> v = Verification("m", "bert", "float32", 1e-5, 1e-5, 12, 1, 9, (LayerCheck(0, 3e-7, 1e-6, 1e-6, 2e-7, True),), 0.1, 0.05)
>>> html_view(v) == v._repr_html_(), html_view(v)[:40]
(True, '<p><b>attention verified: max |Δ| = 3.0e')
"""

from __future__ import annotations

from html import escape
from typing import Any, Callable

import pandas as pd

from headscope.analyses.coref import ProbeResult
from headscope.analyses.heads import HeadScores
from headscope.analyses.mechanisms import MechanismsReport
from headscope.analyses.patching import AttributionPatching, PatchResult
from headscope.probe.results import CompositionScores, CopyingScores, DLAResult, Explanation, QKAttribution, Verification
from headscope.probe.types import AttentionMap, head_name
from headscope.probe.wording import counted

__all__ = ["VIEWS", "html_view", "view_for"]

TABLE_UNITS = 30  # a larger attention map is summarised by its units only


def _table(frame: pd.DataFrame, digits: int = 4) -> str:
    """A DataFrame as an HTML table (pandas escapes the cells), floats to `digits` places."""
    return frame.to_html(index=False, float_format=lambda x: f"{x:.{digits}f}")


def _summary(result: Any, *, bold: bool = False) -> str:
    line = escape(result.summary())
    return f"<p><b>{line}</b></p>" if bold else f"<p>{line}</p>"


# ---------------------------------------------------------------- attention


def attention_map_view(amap: AttentionMap) -> str:
    """The units and, for a short text, the last layer's attention averaged over heads: a static table (the
    interactive explorer is `hs.show(amap)`)."""
    shown = " ".join(f"<code>{escape(t)}</code>" for t in amap.labels[:60])
    more = " …" if len(amap) > 60 else ""
    return (
        f"<div><b>AttentionMap</b> ({amap.level} level, {amap.n_layers} layers × {amap.n_heads} heads, "
        f"{len(amap)} units, {'causal' if amap.causal else 'bidirectional'})<br>{shown}{more}"
        f"{_mean_table(amap)}</div>"
    )


def _mean_table(amap: AttentionMap) -> str:
    """The last layer's attention averaged over heads as an HTML table, darker = more attention."""
    n = len(amap)
    if n > TABLE_UNITS or n == 0:
        return "<br><small>hs.show(map) draws every head interactively.</small>"
    mean = amap.attention[-1].detach().float().mean(dim=0).cpu()  # [query, key]
    head = "".join(f"<th style='writing-mode:vertical-rl'>{escape(t)}</th>" for t in amap.labels)
    rows = []
    for q in range(n):
        cells = "".join(_cell(float(mean[q, k]), masked=amap.causal and k > q) for k in range(n))
        rows.append(f"<tr><th style='text-align:right'>{escape(amap.labels[q])}</th>{cells}</tr>")
    return (f"<table style='border-collapse:collapse;font-size:11px'><caption style='caption-side:bottom'>"
            f"layer {amap.layer_ids[-1]}, mean over heads; hs.show(map) draws every head interactively</caption>"
            f"<tr><th></th>{head}</tr>{''.join(rows)}</table>")


def _cell(v: float, *, masked: bool) -> str:
    shade = "#eeeeee" if masked else f"rgba(8,81,156,{min(max(v, 0.0), 1.0):.2f})"
    return f"<td title='{v:.3f}' style='width:14px;height:14px;padding:0;background:{shade}'></td>"


# ---------------------------------------------------------------- probe's results


def verification_view(v: Verification) -> str:
    return _summary(v, bold=True) + v.to_frame().to_html(index=False)


def dla_view(r: DLAResult) -> str:
    return _summary(r) + _table(r.top(10))


def qk_view(r: QKAttribution) -> str:
    return _summary(r) + _table(r.top(10))


def composition_view(r: CompositionScores) -> str:
    return _summary(r) + _table(r.top(10))


def copying_view(r: CopyingScores) -> str:
    return _summary(r) + _table(r.top(10))


def explanation_view(r: Explanation) -> str:
    return _summary(r) + _table(r.table)


# ---------------------------------------------------------------- analyses' results


def head_scores_view(s: HeadScores) -> str:
    rows = []
    for m in s.metrics:
        t = s.top(m, 3)
        cells = ", ".join(f"{head_name(r.layer, r.head)} {r.value:.3f}" for r in t.itertuples()) or "not applicable"
        rows.append({"metric": m, "top heads": cells})
    body = pd.DataFrame(rows).to_html(index=False)
    return (f"<div><b>HeadScores</b> {escape(s.model)}: {s.n_layers} layers × {s.n_heads} heads, "
            f"{counted(s.n_texts, 'text')}, {counted(len(s.roles), 'role')}<br><i>{escape(s.setting)}</i>{body}</div>")


def probe_view(r: ProbeResult) -> str:
    top = r.heads.sort_values(["accuracy", "layer", "head"], ascending=[False, True, True]).head(5)
    base = ", ".join(f"{k} {v:.0%}" for k, v in r.baselines.items())
    return (f"<div><b>{escape(r.task)}</b> on <code>{escape(r.model)}</code> ({escape(r.level)} level, "
            f"n = {r.n})<br><i>{escape(r.verdict)}</i><br>baselines: {escape(base)}{_table(top, 3)}</div>")


def patch_view(r: PatchResult) -> str:
    f = r.to_frame()
    return _summary(r) + _table(f.reindex(f["effect"].abs().sort_values(ascending=False).index).head(10))


def attribution_patching_view(r: AttributionPatching) -> str:
    return _summary(r) + r.to_frame().head(20).to_html(index=False)


def mechanisms_view(r: MechanismsReport) -> str:
    return "".join(f"<p>{escape(line)}</p>" for line in r.lines())


# Result type -> its view. A subclass finds its nearest registered base (`view_for`).
VIEWS: dict[type, Callable[[Any], str]] = {
    AttentionMap: attention_map_view,
    Verification: verification_view,
    DLAResult: dla_view,
    QKAttribution: qk_view,
    CompositionScores: composition_view,
    CopyingScores: copying_view,
    Explanation: explanation_view,
    HeadScores: head_scores_view,
    ProbeResult: probe_view,
    PatchResult: patch_view,
    AttributionPatching: attribution_patching_view,
    MechanismsReport: mechanisms_view,
}


def view_for(result: Any) -> Callable[[Any], str] | None:
    """The view of `result`'s type (or of its nearest registered base class); None when it has none."""
    return next((VIEWS[t] for t in type(result).__mro__ if t in VIEWS), None)


def html_view(result: Any) -> str:
    """`result` as an HTML fragment, drawn by its type's view."""
    view = view_for(result)
    if view is None:
        names = ", ".join(sorted(t.__name__ for t in VIEWS))
        raise TypeError(f"no HTML view is defined for a {type(result).__name__}; views exist for {names}")
    return view(result)
