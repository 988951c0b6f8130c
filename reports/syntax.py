"""The report's Syntax section: its figures (relation bars, a relation's head grid, a decoded tree,
head clusters) and its tables.

Each figure function takes results (`analyses.syntax.SyntaxResult`, `TreeScore`, the clusters
table), never a model, and returns a new `ReportFigure` (`reports.canvas`: no pyplot, no global state);
the report draws them through `reports.panels.FIGURES`. `relations_frame`, `trees_frame` and
`syntax_tables` are the CSV tables written beside the report.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from .canvas import new_figure
from .fonts import font_context

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["relation_bars", "relation_grid", "tree_figure", "cluster_plot", "relations_frame", "trees_frame",
           "syntax_tables"]

_HEAD_COLOUR = "#1f77b4"
_BASE_COLOUR = "#bbbbbb"
_WRONG = "#d62728"


def relation_bars(result: Any, direction: str = "dependent->head", *, ax: Axes | None = None) -> Figure:
    """Per relation with a crowned head: its held-out accuracy (95% Wilson interval) beside the
    best fixed offset's, most frequent relation on top; a star marks a head that beats the offset."""
    rows = [r for r in result.relations if r.direction == direction and r.best_head is not None]
    n = max(len(rows), 1)
    with font_context(result.model):
        fig, ax = new_figure(7.0, 1.2 + 0.32 * n, ax)
        y = np.arange(len(rows))[::-1]  # first row (all relations) at the top
        acc = np.array([r.heldout_accuracy for r in rows], dtype=float)
        base = np.array([r.baseline_accuracy for r in rows], dtype=float)
        lo = np.array([r.ci95[0] for r in rows], dtype=float)
        hi = np.array([r.ci95[1] for r in rows], dtype=float)
        ax.barh(y + 0.2, acc, height=0.4, color=_HEAD_COLOUR, label="best head (held out)",
                xerr=np.vstack([acc - lo, hi - acc]) if rows else None, error_kw={"lw": 1, "capsize": 2})
        ax.barh(y - 0.2, base, height=0.4, color=_BASE_COLOUR, label="best fixed offset")
        labels = [f"{r.relation}{' *' if r.beats_baseline else ''}  (n={r.n})" for r in rows]
        ax.set_yticks(y, labels, fontsize=8)
        ax.set_xlim(0, 1)
        ax.set_xlabel("accuracy on the test sentences")
        ax.legend(loc="lower right", fontsize=8)
        ax.set_title(f"{result.model} · {direction} · * = beats the offset (Holm-adjusted)", fontsize=10)
    return fig


def relation_grid(result: Any, relation: str, direction: str = "dependent->head", *,
                  ax: Axes | None = None) -> Figure:
    """Test accuracy of every head (layer x head) on one relation, the head chosen on the selection split boxed."""
    import matplotlib as mpl
    from matplotlib.patches import Rectangle

    rows = result.heads[(result.heads["relation"] == relation) & (result.heads["direction"] == direction)]
    if rows.empty:
        raise ValueError(f"no relation {relation!r} ({direction}) in this result")
    grid = rows.pivot(index="layer", columns="head", values="accuracy").sort_index().sort_index(axis=1)
    score = result.relation(relation, direction)
    n_l, n_h = grid.shape
    with font_context(result.model):
        fig, ax = new_figure(min(14.0, 2.4 + 0.5 * n_h), min(16.0, 1.6 + 0.32 * n_l), ax)
        img = ax.imshow(np.ma.masked_invalid(grid.to_numpy(dtype=float)), cmap=mpl.colormaps["viridis"],
                        vmin=0, vmax=1, aspect="auto", interpolation="nearest")
        ax.set_xticks(range(n_h), [str(h) for h in grid.columns], fontsize=7)
        ax.set_yticks(range(n_l), [str(l) for l in grid.index], fontsize=7)
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
        if score.best_head is not None:
            r, c = list(grid.index).index(score.best_head[0]), list(grid.columns).index(score.best_head[1])
            ax.add_patch(Rectangle((c - 0.5, r - 0.5), 1, 1, fill=False, edgecolor=_WRONG, lw=2))
        fig.colorbar(img, ax=ax, label="accuracy (test)", shrink=0.8)
        base = "-" if score.baseline_accuracy is None else f"{score.baseline_accuracy:.0%}"
        off = "" if score.baseline_offset is None else f" ({score.baseline_offset:+d})"
        ax.set_title(f"{result.model} · {relation} ({direction}), n={score.n}\nbest fixed offset{off}: {base}",
                     fontsize=10)
    return fig


def _arcs(ax: Axes, heads: Sequence[int], *, above: bool, colours: Sequence[str]) -> None:
    from matplotlib.patches import Arc

    sign = 1 if above else -1
    for d, g in enumerate(heads):
        if g < 0:
            continue
        width = abs(d - g)
        ax.add_patch(Arc(((d + g) / 2, 0), width, 0.7 * width ** 0.8, theta1=0 if above else 180,
                         theta2=180 if above else 360, color=colours[d], lw=1.3))
        ax.plot([d], [sign * 0.05], marker="v" if above else "^", color=colours[d], ms=4)


def tree_figure(trees: Any, *, ax: Axes | None = None) -> Figure:
    """One test sentence with its gold tree above the words and the tree decoded from the chosen
    head below (an arc in red where no gold arc joins the same two words)."""
    sentence, predicted = trees.example, list(trees.example_heads)
    if sentence is None or not predicted:
        raise ValueError("this tree result carries no example sentence")
    n = len(sentence)
    gold = {frozenset((d, g)) for d, g in enumerate(sentence.heads) if g >= 0}
    colours = ["black" if g < 0 or frozenset((d, g)) in gold else _WRONG for d, g in enumerate(predicted)]
    height = 0.7 * max(1, n - 1) ** 0.8 / 2 + 0.6
    with font_context(sentence.text):
        fig, ax = new_figure(min(16.0, 1.0 + 0.75 * n), 3.2, ax)
        _arcs(ax, sentence.heads, above=True, colours=["#555555"] * n)
        _arcs(ax, predicted, above=False, colours=colours)
        for i, form in enumerate(sentence.forms):
            ax.text(i, 0, form, ha="center", va="center", fontsize=9,
                    bbox={"boxstyle": "round,pad=0.2", "fc": "white", "ec": "#cccccc"})
        ax.text(sentence.root, height * 0.9, "root", ha="center", fontsize=7, color="#555555")
        ax.set_xlim(-0.8, n - 0.2)
        ax.set_ylim(-height, height)
        ax.axis("off")
        layer, head = trees.best_head
        right = sum(frozenset((d, g)) in gold for d, g in enumerate(predicted) if g >= 0)
        ax.set_title(f"gold tree (above) · tree decoded from L{layer}H{head} (below): {right}/{n - 1} arcs right",
                     fontsize=10)
    return fig


def cluster_plot(clusters: pd.DataFrame, *, ax: Axes | None = None) -> Figure:
    """Heads embedded in 2-D by the distance between their attention (columns `model, layer, head,
    x, y, role`): colour = layer (relative depth when several models), marker = model, text = role."""
    import matplotlib as mpl

    markers = "osD^vP*X"
    models = list(dict.fromkeys(clusters["model"]))
    depth = clusters.groupby("model")["layer"].transform(lambda s: s / max(int(s.max()), 1))
    cmap = mpl.colormaps["viridis"]
    with font_context("".join(str(r) for r in clusters.get("role", []))):
        fig, ax = new_figure(7.0, 6.0, ax)
        for k, model in enumerate(models):
            sel = (clusters["model"] == model).to_numpy()
            ax.scatter(clusters["x"][sel], clusters["y"][sel], c=cmap(depth[sel].to_numpy()), s=28,
                       marker=markers[k % len(markers)], edgecolors="white", linewidths=0.4, label=model)
        for row in clusters.itertuples():
            if getattr(row, "role", ""):
                ax.annotate(row.role, (row.x, row.y), fontsize=6, xytext=(3, 3), textcoords="offset points")
        fig.colorbar(mpl.cm.ScalarMappable(norm=mpl.colors.Normalize(0, 1), cmap=cmap), ax=ax,
                     label="layer (0 = first, 1 = last)", shrink=0.8)
        if len(models) > 1:
            ax.legend(fontsize=8)
        ax.set_xticks([])
        ax.set_yticks([])
        ax.set_title("heads by the distance between their attention (Jensen-Shannon, MDS)", fontsize=10)
    return fig


# ---------------------------------------------------------------- tables

_RELATION_COLUMNS = ["relation", "direction", "n", "best_head", "heldout_accuracy", "ci95_low", "ci95_high",
                     "baseline_offset", "baseline_accuracy", "p_value", "p_holm", "beats_baseline", "verdict",
                     "n_select", "heldout_correct", "baseline_correct", "n_after"]


def relations_frame(result: Any) -> pd.DataFrame:
    """One row per relation and direction: the head chosen on the selection sentences (`L1H3`), its
    held-out accuracy with the 95% Wilson interval, the best offset's, the p-values and the verdict."""
    import pandas as pd

    from headscope.probe.types import head_name

    rows = []
    for r in result.relations:
        lo, hi = r.ci95 if r.ci95 else (None, None)
        rows.append({"relation": r.relation, "direction": r.direction, "n": r.n,
                     "best_head": head_name(*r.best_head) if r.best_head else None,
                     "heldout_accuracy": r.heldout_accuracy, "ci95_low": lo, "ci95_high": hi,
                     "baseline_offset": r.baseline_offset, "baseline_accuracy": r.baseline_accuracy,
                     "p_value": r.p_value, "p_holm": r.p_holm, "beats_baseline": r.beats_baseline,
                     "verdict": r.verdict, "n_select": r.n_select, "heldout_correct": r.heldout_correct,
                     "baseline_correct": r.baseline_correct, "n_after": r.n_after})
    return pd.DataFrame(rows, columns=_RELATION_COLUMNS)


def trees_frame(result: Any) -> pd.DataFrame:
    """The trees row: the chosen head's UUAS beside right-branching and the offset tree, and p."""
    import pandas as pd

    from headscope.probe.types import head_name

    t = result.trees
    if t is None:
        return pd.DataFrame()
    return pd.DataFrame([{"best_head": head_name(*t.best_head), "uuas": t.uuas,
                          "right_branching_uuas": t.right_branching_uuas, "offset": t.offset,
                          "offset_uuas": t.offset_uuas, "baseline": t.baseline, "p_value": t.p_value,
                          "n_sentences": t.n_sentences, "n_edges": t.n_edges, "select_uuas": t.select_uuas,
                          "select_sentences": t.select_sentences, "verdict": t.verdict}])


def syntax_tables(result: Any, clusters: pd.DataFrame | None) -> dict[str, pd.DataFrame]:
    """The Syntax section's CSV tables by name (what is missing is left out)."""
    tables = {}
    if result is not None:
        tables = {"syntax_relations": relations_frame(result), "syntax_heads": result.heads,
                  "syntax_trees": trees_frame(result)}
    if clusters is not None:
        tables["syntax_clusters"] = clusters
    return tables
