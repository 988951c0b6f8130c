"""The report's ablation evidence: what ablating heads does, beside what they look at.

`evidence_view(section)` turns a section's `analyses.evidence.AblationEvidence` into the strings and
tables that `templates/_evidence.html.j2` shows in the head-roles section (the roles table with
importance rank and single-head effect, a sentence per role, the induction ablation, the rank
correlations) and `probe_line` gives each probe's cloze check. `ablation_heads_table` is the CSV.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from headscope.analyses.evidence import HARM_COLUMN, INTERVAL_METHOD
from headscope.probe.wording import number

__all__ = ["evidence_view", "ablation_heads_table", "probe_line", "roles_table"]


def evidence_view(section: Any) -> dict | None:
    """Strings and frames for the template, or None where the ablation evidence was not run."""
    e, scores = section.evidence, section.scores
    if e is None:
        return None
    correlations = pd.DataFrame([{"score": c.score, "Spearman ρ": c.rho,
                                  "95% interval": "n/a" if math.isnan(c.low) else f"{number(c.low, 2)} – {number(c.high, 2)}",
                                  "heads": c.n} for c in e.correlations(scores)])
    return {
        "summary": (f"Every head ablated alone ({e.method} ablation) on {e.n_texts} corpus texts; its harm "
                    f"({HARM_COLUMN}, higher = hurt more, 0 = no change) is the {e.harm_description}; "
                    f"each head is compared with {e.n_random} other heads ablated alone (seed {e.seed}), "
                    "p = (1 + #random heads at least as strong) / (1 + draws). Importance rank: gradient head "
                    f"importance (Michel et al. 2019, loss: {e.importance_loss}) over the same texts, 1 = highest."),
        "roles": None if scores is None else [{"role": r, "sentence": s} for r, s in e.role_verdicts(scores.roles)],
        "induction": None if e.induction is None else e.induction.verdict,
        "correlations": correlations,
        "interval": INTERVAL_METHOD,
    }


def roles_table(section: Any) -> pd.DataFrame:
    """The roles table, with importance rank and single-head ablation harm columns when the evidence is there."""
    roles = section.scores.roles
    return roles if section.evidence is None else section.evidence.roles_table(roles)


def probe_line(section: Any, task: str) -> str | None:
    """'ablating the chosen head flips 12/40 cloze preferences; random ...' for one probe, or why not."""
    e = section.evidence
    if e is None:
        return None
    check = (e.choices or {}).get(task)
    if check is None:
        return None
    if "skipped" in check:
        return f"Ablation check not run: {check['skipped']}."
    return f"Ablation check: {check['flips_verdict']} Mean preference shift: {check['verdict']}"


def ablation_heads_table(section: Any) -> pd.DataFrame | None:
    """One row per head: single-head harm (`ablation_harm`), importance and its rank (CSV `ablation_heads`)."""
    if section.evidence is None:
        return None
    return pd.DataFrame(section.evidence.to_dict()["heads"]).assign(
        effect_metric=section.evidence.effect_metric, method=section.evidence.method)
