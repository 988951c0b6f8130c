"""analyses

The package's names are looked up in their modules on first use (PEP 562), so importing one module
(`headscope.analyses.heads`) does not load the others (coref's relation probes, and what they import)."""
from __future__ import annotations

import importlib

_HOMES = {
    # coreference / relation probes
    "ProbeResult": "coref", "ProbeScores": "coref", "score_probe": "coref",
    "RelationExample": "relations", "builtin_set": "relations", "read_gap": "relations", "read_jsonl": "relations",
    "read_probe_file": "relations",
    # per-head pattern analyses
    "CorpusError": "corpus", "builtin_corpus": "corpus", "iter_corpus": "corpus", "read_corpus": "corpus",
    "METRICS": "heads", "THRESHOLDS": "heads", "HeadScoreAccumulator": "heads", "HeadScores": "heads",
    "assign_roles": "heads", "score_corpus": "heads",
    "detection_pattern": "induction", "pattern_score": "induction", "repeated_random_tokens": "induction",
}
__all__: list[str] = list(_HOMES)


def __getattr__(name: str):
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOMES})
