"""The Long context section's view and tables (`headscope run --long-context`): a `RetrievalResult` as the
template reads it — the needle grid, the retrieval heads, the causal check, the cost curve and its verdicts —
and the CSV tables beside the page (the per-head table, the per-KV-head plan in DuoAttention's 1/0 form, the
curve). No model."""

from __future__ import annotations

import pandas as pd

from headscope.analyses.longcontext import NO_COPIES, RetrievalResult, curve_verdicts
from headscope.probe.types import head_name

__all__ = ["long_context_frames", "grid_frame", "curve_view", "long_context_tables"]


def grid_frame(r: RetrievalResult) -> pd.DataFrame:
    """Per needle length × depth: the needles, and how many the full model retrieved (selection needles in the
    scoring pass, held-out needles in the causal check's clean run)."""
    clean = iter(r.check.clean) if r.check is not None else iter(())
    sel = iter(r.selection_correct)
    rows = []
    for n in r.needles:
        got = next(sel) if n.split == "selection" else next(clean, None)
        rows.append({"length": n.length, "depth": n.depth, "split": n.split, "retrieved": got})
    frame = pd.DataFrame(rows)
    return (frame.groupby(["length", "depth"], as_index=False)
            .agg(needles=("split", "size"), retrieved=("retrieved", lambda x: int(x.dropna().sum())),
                 scored=("retrieved", lambda x: int(x.notna().sum()))))


def curve_view(costs: pd.DataFrame) -> pd.DataFrame:
    """The cost curve as the page shows it: held-out needles as k / n with their Wilson interval, the
    perplexity change in percent, the KV cache in MB and as a share of full (the CSV keeps the raw columns)."""
    def pct(x: float) -> str:
        return "—" if pd.isna(x) else f"{100 * x:+.1f}%"

    return pd.DataFrame({
        "plan": costs["plan"],
        "full KV heads": costs["n_full"],
        "held-out needles": [f"{round(a * n)}/{n}" for a, n in zip(costs["needle_accuracy"], costs["needles"])],
        "95% interval": [f"{lo:.2f}–{hi:.2f}" for lo, hi in zip(costs["accuracy_low"], costs["accuracy_high"])],
        "perplexity": costs["perplexity"].round(2),
        "change": [pct(x) for x in costs["perplexity_change"]],
        "KV cache": [f"{b / 1e6:.1f} MB ({s:.0%})" for b, s in zip(costs["kv_bytes"], costs["kv_share"])],
    })


def long_context_frames(r: RetrievalResult) -> dict:
    """The strings and frames the section shows."""
    ranked = r.scores.top(min(10, r.scores.hits.size)) if r.scores.scored else ()  # no copy step: no ranking
    top = [{"head": head_name(l, h), "retrieval score": float(r.scores.score[l, h]),
            "hits": int(r.scores.hits[l, h]), "95% low": r.scores.interval(l, h)[0],
            "95% high": r.scores.interval(l, h)[1]} for l, h in ranked]
    curve = None if r.costs is None else curve_view(r.costs)
    s = r.settings
    return {"grid": grid_frame(r), "top": pd.DataFrame(top) if top else None, "curve": curve,
            "no_copies": None if r.scores.scored else NO_COPIES,
            "check": None if r.check is None else r.check.verdict,
            "verdicts": [] if r.costs is None else curve_verdicts(r.costs),
            "setting": (f"{len(r.needles)} needles ({len(r.selection_correct)} selection, "
                        f"{len(r.needles) - len(r.selection_correct)} held out) of {', '.join(map(str, s['lengths']))} "
                        f"tokens; {r.scores.copies} copy steps; streaming heads keep sink {s['sink']} + recent "
                        f"{s['recent']} keys; masks {'at every token' if s.get('scope') == 'prompt' else 'from the question on'}"),
            "plan": (f"plan by {r.ranking}: {r.plan.n_full} of {r.plan.n_planned} KV heads full"),
            "gates": _gate_line(s.get("gates"))}


def _gate_line(g: dict | None) -> str | None:
    """DuoAttention's gate optimisation in words: its steps, tokens and λ (the issue asks them said)."""
    if not g:
        return None
    return (f"gates: DuoAttention's gate optimisation, {g['steps']} Adam steps (lr {g['lr']:g}) over {g['examples']} "
            f"selection needles, {g['tokens']:,} tokens in all, λ = {g['l1']:g} on the mean gate; loss "
            f"{g['loss_first']:.3g} → {g['loss_last']:.3g}")


def long_context_tables(r: RetrievalResult | None) -> dict[str, pd.DataFrame | None]:
    if r is None:
        return {}
    return {"long_context_heads": r.to_frame(), "long_context_kv_heads": r.kv_frame(), "long_context_curve": r.costs}
