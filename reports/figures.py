"""Figures of attention, head scores, probes, mechanisms and verification: one per result type, and `plot`.

Every function takes plain results (`AttentionMap`, `HeadScores`, `ProbeResult`, `Verification`,
`DLAResult`, `PatchResult`, DataFrames), never a model, and returns a `ReportFigure` (`reports.canvas`):
the same figure from the CLI, the report and a notebook, where it displays as the very PNG the report
writes. Text is drawn with fonts that cover CJK, Arabic and emoji (`reports.fonts`); the heatmaps they
are made of are `reports.heatmaps`.

Head and layer arguments are model indices (`amap.layer_ids` / `amap.head_ids`), so a map that
kept only some heads is addressed the same way as a full one.

`plot(result, **kw)` picks the figure by the result's type. Which figures a report draws, and from
what, is `reports.panels.FIGURES`; files and sizes for papers are `reports.canvas` (`save`).
"""

from __future__ import annotations

import functools
import math
import textwrap
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from headscope.analyses.coref import ProbeResult
from headscope.analyses.flow import FLOW_MAX_SECONDS, TOKEN_MAPS, TokenMap, flow
from headscope.analyses.heads import HeadScores
from headscope.analyses.metrics import METRICS
from headscope.analyses.patching import PatchResult
from headscope.probe.results import CompositionScores, DLAResult, Verification
from headscope.probe.types import AttentionMap, head_name, position
from headscope.probe.wording import number

from .canvas import new_figure
from .fonts import font_context
from .heatmaps import (NO_ATTENTION, display_label, grid_figure, grid_heatmap, label_no_attention, outline_heads,
                       token_heatmap, with_no_attention_rows)
from .vision import layer_overlays, patch_overlay, patch_rollout
from .vision_language import image_mosaic, image_overlay, image_rollout_figure

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

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
    "composition_graph",
    "best_heads",
    "plot",
]


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
    li, hi = position(amap.layer_ids, layer, "layer"), position(amap.head_ids, head, "head")
    weights = amap.attention[li, hi].detach().float().cpu().numpy()  # [query, key]
    model = amap.meta.get("model", "")
    cross = hasattr(amap, "queries")
    return token_heatmap(weights, amap, ax=ax, cmap=cmap, cbar="attention weight",
                          title=title or f"{model + ' · ' if model else ''}{'cross-attention · ' if cross else ''}"
                                         f"layer {layer} head {head} · {amap.level} level",
                          xlabel="source key (attended to)" if cross else "key (attended to)",
                          ylabel="target query (attending)" if cross else "query (attending)")


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
            fig, ax = new_figure(6.0, 1.6, ax)
            ax.axis("off")
            ax.text(0.5, 0.5, textwrap.fill(f"Attention flow skipped: {exc}. The rollout above is drawn; "
                                            "for the flow, use a shorter text.", 80),
                    ha="center", va="center", fontsize=10, transform=ax.transAxes)
            ax.set_title(f"{model + ' · ' if model else ''}attention flow skipped · {amap.level} level", fontsize=11)
        return fig
    # A flow's rows are normalised over every input token, so a short sentence's shares all sit near 1/T and a
    # 0–1 scale draws them near-uniformly pale: the flow is drawn from its smallest to its largest share (a causal
    # map's masked cells left out), and the colour bar says so.
    vmin, vmax = 0.0, 1.0
    if kind == "flow" and weights.size:
        seen = weights[np.tril(np.ones(weights.shape, dtype=bool))] if amap.causal else weights.ravel()
        low, high = float(np.nanmin(seen)), float(np.nanmax(seen))
        if high > low:
            vmin, vmax = low, high
    scale = f", {number(vmin)} – {number(vmax)} (its range)" if (vmin, vmax) != (0.0, 1.0) else ""
    return token_heatmap(weights, amap, ax=ax, cmap=cmap, cbar=f"share of the output ({kind}){scale}",
                         title=f"{model + ' · ' if model else ''}attention {kind} · {amap.level} level",
                         xlabel="input token", ylabel="output token (after the last layer)", vmin=vmin, vmax=vmax)


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
            block = att[position(amap.layer_ids, layer), j].copy()
            if amap.causal:
                block[np.triu_indices(n, k=1)] = np.nan
            mosaic[i * tile : i * tile + n, j * tile : j * tile + n] = block
    width = min(max_width, 1.0 + 0.9 * n_h)
    height = width * (n_l / n_h) * 0.98 + 0.9
    with font_context(amap.text + str(amap.meta.get("model", ""))):
        fig, ax = new_figure(width + 1.0, height, None)
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
        fig, ax = grid_figure(grid, ax)
        grid_heatmap(ax, grid, vmin=vmin, vmax=vmax, cmap=cmap, center=None, fmt=".2f", label=label)
        label_no_attention(ax, list(grid.index), no_attention, grid.shape[1])
        outline_heads(ax, grid, [(l, h) for l, h, _ in best])
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
        fig, ax = grid_figure(grid, ax)
        grid_heatmap(ax, grid, vmin=-bound, vmax=bound, cmap="vlag", center=0.0, fmt=fmt, label=label)
        outline_heads(ax, grid, [(l, h) for l, h, _ in best])
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
        fig, ax = new_figure(9.0, 5.5, ax)
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
        fig, ax = grid_figure(grid, ax)
        grid_heatmap(ax, grid, vmin=-bound, vmax=bound, cmap="vlag", center=0.0, fmt="+.2f",
                      label=f"{label}: B − A")
        outline_heads(ax, grid, changed)
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
        fig, ax = grid_figure(grid, ax)
        grid_heatmap(ax, grid, vmin=0.0, vmax=1.0, cmap="vlag_r", center=chance, fmt=".2f",
                      label="accuracy (all examples)")
        label_no_attention(ax, list(grid.index), tuple(no_attention), grid.shape[1])
        if result.best_head is not None:
            outline_heads(ax, grid, [tuple(result.best_head)], colour="black")
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
        fig, ax = new_figure(9.0, 0.9 + 0.21 * (len(shown) + 1.6 * len(ids)), ax)
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
        fig, ax = new_figure(min(12.0, 4.5 + 0.25 * len(frame)), 3.4, ax)
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
    raise TypeError(f"no figure is defined for a {type(result).__name__}; plot takes an AttentionMap, a HeadScores, "
                    "a Verification, a ProbeResult, a DLAResult, a PatchResult or a CompositionScores")


@plot.register(AttentionMap)
def _plot_attention(result: AttentionMap, *, layer: int | None = None, head: int | None = None,
                    view: str | None = None, **kwargs: Any) -> Figure:
    """An image's map is drawn over its patches: `head` from [CLS] (or `query=`), every head of `layer`
    without a head, `view="rollout"`; `view="heatmap"` (a text's only view) draws the query × key heatmap.
    A vision–language map (image tokens among its text) is drawn over its pictures: `head`'s attention from a
    text token (`query=`: a unit index or a word; the last text token by default), every head of `layer`
    without a head, `view="mosaic"` every layer × head, `view="rollout"` the rollout through the decoder."""
    if any(p is not None for p in result.patches) and view != "heatmap":
        if view == "rollout":
            return image_rollout_figure(result, **kwargs)
        if view == "mosaic":
            return image_mosaic(result, **kwargs)
        if layer is None:
            raise TypeError("plot(amap, layer=, head=): give the layer to draw (or view='mosaic' / 'rollout')")
        return image_mosaic(result, layers=[layer], **kwargs) if head is None else \
            image_overlay(result, layer, head, **kwargs)
    if result.is_image and view == "rollout":
        return patch_rollout(result, **kwargs)
    if layer is None:
        raise TypeError("plot(amap, layer=, head=): give the layer and head to draw")
    if result.is_image and view != "heatmap":
        return layer_overlays(result, layer, **kwargs) if head is None else patch_overlay(result, layer, head, **kwargs)
    if head is None:
        raise TypeError("plot(amap, layer=, head=): give the head to draw")
    return attention_heatmap(result, layer, head, **kwargs)


@plot.register(HeadScores)
def _plot_scores(result: HeadScores, *, metric: str, **kwargs: Any) -> Figure:
    return score_grid(result, metric, **kwargs)


# One drawing per result type, taking the result and the drawing's own keyword arguments.
for _type, _draw in ((Verification, verification_plot), (DLAResult, dla_grid), (PatchResult, patch_grid),
                     (ProbeResult, probe_grid), (CompositionScores, composition_graph)):
    plot.register(_type, _draw)
del _type, _draw
