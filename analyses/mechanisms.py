"""The report's Mechanisms section as one result (`headscope run --mechanisms`, `workflows.mechanisms.mechanisms`).

    MechanismsReport
        dla           one `probe.results.DLAResult` per report sentence: its next token (the model's own
                      most likely one) split into the residual stream's parts (decoders)
        composition   `probe.results.CompositionScores`: Q-, K-, V-composition between every pair of heads
                      (any model); the tables keep the `edges` strongest edges of each kind
        patching      `analyses.patching.PatchResult`: head-output patching of a built-in pair set (decoders),
                      with its held-out check and verdict
        notes         one line for each part that could not run, and why (an encoder: no DLA, no patching)

A result, never a model: the report draws it (`reports.panels.FIGURES`) and writes its tables.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping

import pandas as pd

from headscope.probe.types import Viewable, head_name

if TYPE_CHECKING:
    from headscope.probe.results import CompositionScores, DLAResult

    from .patching import PatchResult

__all__ = ["MechanismsReport", "COMPOSITION_EDGES"]

COMPOSITION_EDGES = 50  # strongest edges of each kind kept in the tables (the graph draws fewer)


@dataclass(frozen=True, eq=False)
class MechanismsReport(Viewable):
    """DLA of the report sentences' next tokens, the composition scores, head-output patching of a pair set."""

    model: str
    dla: tuple[DLAResult, ...] = ()
    composition: CompositionScores | None = None
    patching: PatchResult | None = None
    pair_set: str | None = None  # the built-in pair set patched
    edges: int = COMPOSITION_EDGES
    notes: tuple[str, ...] = ()  # why a part did not run
    seconds: Mapping[str, float] = field(default_factory=dict)  # wall time of each part

    def dla_frame(self) -> pd.DataFrame | None:
        """Every part of every sentence's DLA, one row each, the sentence and its next token first."""
        if not self.dla:
            return None
        parts = [r.to_frame().assign(sentence=i + 1, prompt=r.prompt, answer=r.answer, total=r.total,
                                     identity_abs_err=r.identity_abs_err) for i, r in enumerate(self.dla)]
        f = pd.concat(parts, ignore_index=True)
        first = ["sentence", "prompt", "answer", "total", "identity_abs_err"]
        return f[first + [c for c in f.columns if c not in first]]

    def composition_frame(self) -> pd.DataFrame | None:
        """The `edges` strongest edges of each kind (by the ratio to random matrices)."""
        c = self.composition
        if c is None:
            return None
        return pd.concat([c.top(self.edges, kind) for kind in c.scores], ignore_index=True)

    def patching_frame(self) -> pd.DataFrame | None:
        return None if self.patching is None else self.patching.to_frame()

    def to_frame(self) -> pd.DataFrame:
        """One row per (measure, head): each sentence's DLA (`dla 1`, ...) and the normalised patching
        effect (`patching`), tidy: measure, layer, head, head_name, value."""
        rows: list[dict[str, Any]] = []
        for i, r in enumerate(self.dla):
            for x in r.table[r.table["kind"] == "head"].itertuples():
                rows.append({"measure": f"dla {i + 1}", "layer": int(x.layer), "head": int(x.head), "value": float(x.value)})
        if self.patching is not None:
            f = self.patching.to_frame()
            for x in f[f["head"].notna()].itertuples():
                rows.append({"measure": "patching", "layer": int(x.layer), "head": int(x.head),
                             "value": float(x.normalised)})
        frame = pd.DataFrame(rows, columns=["measure", "layer", "head", "value"])
        frame.insert(3, "head_name", [head_name(l, h) for l, h in zip(frame["layer"], frame["head"])])
        return frame

    def lines(self) -> list[str]:
        """One line per part: its headline, or why it did not run."""
        out = [r.summary() for r in self.dla]
        if self.composition is not None:
            out.append(self.composition.summary())
        if self.patching is not None:
            out.append(self.patching.summary())
        return out + list(self.notes)

    def summary(self) -> str:
        return "\n".join(self.lines())

    def to_dict(self) -> dict:
        return {"model": self.model, "dla": [r.to_dict() for r in self.dla],
                "composition": None if self.composition is None else {
                    "baseline": dict(self.composition.baseline), "edges_kept": self.edges,
                    "summary": self.composition.summary()},
                "patching": None if self.patching is None else {
                    k: v for k, v in self.patching.to_dict().items() if k in (
                        "what", "direction", "n_pairs", "dropped_pairs", "clean", "corrupt", "seconds", "forwards",
                        "confirmation", "verdict")} | {"pair_set": self.pair_set},
                "notes": list(self.notes), "seconds": dict(self.seconds)}
