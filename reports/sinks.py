"""The report's Sinks section (`headscope run --sinks`): its figures and tables.

Each figure takes results (`analyses.sinks.SinkReport`, `StreamingResult`), never a model, and returns a
new `ReportFigure` (`reports.canvas`); the report draws them through `reports.panels.FIGURES`.
`sinks_tables` are the CSV tables written beside the report.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from .canvas import new_figure
from .fonts import font_context

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["sink_share_grid", "massive_figure", "streaming_figure", "sinks_tables"]


def sink_share_grid(report: Any, *, ax: Axes | None = None) -> Figure:
    """Per head (layer × head): the attention share on position 0; heads called dormant by ablation marked ○,
    sink heads whose ablation matters marked ●."""
    h = report.heads
    L, H = int(h["layer"].max()) + 1, int(h["head"].max()) + 1
    grid = np.full((L, H), np.nan)
    grid[h["layer"].to_numpy(), h["head"].to_numpy()] = h["first_share_1"].to_numpy(dtype=float)
    with font_context(report.model):
        fig, ax = new_figure(min(2.0 + 0.35 * H, 12.0), 1.2 + 0.28 * L, ax)
        im = ax.imshow(grid, vmin=0, vmax=1, cmap="viridis", aspect="auto")
        fig.colorbar(im, ax=ax, label="attention on position 0")
        if "dormant" in h.columns:
            for r in h.itertuples():
                if r.dormant is True:
                    ax.text(r.head, r.layer, "○", ha="center", va="center", color="white", fontsize=8)
                elif r.dormant is False:
                    ax.text(r.head, r.layer, "●", ha="center", va="center", color="white", fontsize=8)
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
        ax.set_title(f"{report.model} · share on position 0 (○ dormant, ● active by ablation)", fontsize=10)
    return fig


def massive_figure(report: Any, *, ax: Axes | None = None) -> Figure:
    """The largest |activation| of each layer's residual stream against the layer's median (log scale)."""
    m = report.massive
    with font_context(report.model):
        fig, ax = new_figure(7.0, 3.2, ax)
        top = m.loc[m.groupby("layer")["ratio_to_median"].idxmax()] if len(m) else m
        if len(top):
            ax.semilogy(top["layer"], top["value"].abs(), "o-", label="largest |activation|")
            ax.semilogy(top["layer"], top["value"].abs() / top["ratio_to_median"], "s--", color="#999999",
                        label="median |activation|")
            for r in top[top["massive"]].itertuples():
                ax.annotate(f"{r.token} · dim {r.dim}", (r.layer, abs(r.value)), fontsize=7, rotation=30,
                            xytext=(3, 3), textcoords="offset points")
        ax.set_xlabel("layer")
        ax.set_ylabel("|activation| (residual stream)")
        ax.legend(fontsize=8)
        ax.set_title(f"{report.model} · largest activation per layer; labelled: massive (Sun et al. 2024)", fontsize=10)
    return fig


def _smooth(v: np.ndarray, width: int) -> np.ndarray:
    width = max(1, min(width, len(v)))
    return np.convolve(v, np.ones(width) / width, mode="valid")


def streaming_figure(result: Any, *, ax: Axes | None = None, smooth: int = 64) -> Figure:
    """Next-token loss against position (a running mean over `smooth` positions) under dense attention, the
    window alone, and the window plus the first `keep` tokens; the window's edge dotted."""
    with font_context(result.model):
        fig, ax = new_figure(7.0, 3.2, ax)
        lines = [("dense", result.dense, "#1f77b4"), (f"window of {result.window}", result.window_only, "#d62728"),
                 (f"window + first {result.keep}", result.sink_window[result.keep], "#2ca02c")]
        for label, nll, colour in lines:
            y = _smooth(np.asarray(nll, dtype=float), smooth)
            x = np.arange(len(y)) + 1 + (len(nll) - len(y)) // 2 + 1
            ax.plot(x, y, label=label, color=colour, lw=1.2)
        ax.axvline(result.window, color="#999999", ls=":", lw=1)
        ax.set_xlabel("position of the predicted token")
        ax.set_ylabel(f"next-token loss (nats, mean of {smooth})")
        ax.legend(fontsize=8)
        ax.set_title(f"{result.model} · StreamingLLM test on {result.n_tokens} tokens", fontsize=10)
    return fig


def sinks_tables(report: Any, streaming: Any) -> dict[str, pd.DataFrame | None]:
    """The Sinks section's CSV tables: per head, the sink rates, the massive activations, the loss per position."""
    return {
        "sink_heads": None if report is None else report.to_frame().drop(columns="model"),
        "sink_rates": None if report is None else report.rates_frame(),
        "massive_activations": None if report is None else report.massive,
        "streaming_nll": None if streaming is None else streaming.to_frame(),
    }
