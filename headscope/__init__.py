"""headscope: real attention from pretrained models, verified from scratch, analysed head by head.

    >>> import headscope as hs                                                   # doctest: +SKIP
    >>> lm = hs.load("minilm")                                                   # doctest: +SKIP
    >>> maps = hs.extract(lm, ["The animal didn't cross the street because it was too tired."], level="word")  # doctest: +SKIP
    >>> hs.verify(lm).passed, hs.heads(lm, hs.builtin_corpus()[:20]).top("previous_token", 3)  # doctest: +SKIP

This module is the façade and nothing else: every public name is defined once, in the module that
`_HOMES` names, and looked up there on first use. So importing headscope loads no model, reads no
file and does not import torch; `dir(hs)` and `hs.__all__` list the API. The rooms below it:

    probe/        models, attention extraction, its sources (eager / recompute / auto), the
                  from-scratch attention and its verification, interventions
    analyses/     what heads do, relation probes, syntax, statistics: results from maps, never a model
    reports/      figures, the HTML report (its sections, its folder), notebook views
    workflows/    the questions composed from those: heads, relations, syntax, ablation, compare, run
"""

from __future__ import annotations

import importlib
import warnings
from importlib import metadata

try:
    __version__ = metadata.version("headscope")
except metadata.PackageNotFoundError:  # run from a source tree that was never installed
    __version__ = "0+unknown"

# public name -> "module" (the same name there) or ("module", "name there")
_HOMES: dict[str, str | tuple[str, str]] = {
    # models and their attention
    "load": ("headscope.probe.loading", "load_model"),
    "LoadedModel": "headscope.probe.model",
    "Placement": "headscope.probe.device_placement",
    "extract": "headscope.probe.extract",
    "save_maps": "headscope.probe.mapfiles",
    "load_maps": "headscope.probe.mapfiles",
    "fit_context": "headscope.probe.encoding",
    "verify": "headscope.probe.verify",
    "explain": "headscope.probe.explain",
    "source_for": "headscope.probe.sources",
    "SOURCES": "headscope.probe.sources",
    "memory_budget": "headscope.probe.sources",
    "norm_attention": "headscope.probe.norms",
    "generate_attention": "headscope.probe.generate",
    "from_hf": "headscope.probe.interop",
    "from_transformer_lens": "headscope.probe.interop",
    "long_frame": "headscope.probe.interop",
    "towers": "headscope.probe.towers",
    "image_text": "headscope.probe.towers",
    "ImageText": "headscope.probe.towers",
    "image_cross_attention": "headscope.probe.image_cross",
    "ImageCrossAttention": "headscope.probe.types",
    # the workflows
    "extract_file": "headscope.workflows.mapfile",
    "ExtractedFile": "headscope.workflows.mapfile",
    "heads": "headscope.workflows.heads",
    "checked_heads": "headscope.workflows.heads",
    "induction_inputs": "headscope.workflows.heads",
    "extract_scores": "headscope.workflows.relations",
    "relation_probe": "headscope.workflows.relations",
    "coref": "headscope.workflows.relations",
    "probe_sets": "headscope.workflows.relations",
    "syntax": "headscope.workflows.syntax",
    "syntax_clusters": "headscope.workflows.syntax",
    "ablate": "headscope.workflows.ablation",
    "ablate_each": "headscope.workflows.ablation",
    "heads_by_metric": "headscope.workflows.ablation",
    "ablate_chosen_head": "headscope.workflows.ablation",
    "importance": "headscope.workflows.ablation",
    "choice_check": "headscope.workflows.ablation",
    "ablation_evidence": "headscope.workflows.ablation",
    "Cloze": "headscope.workflows.ablation",
    "Choice": "headscope.workflows.ablation",
    "InductionTask": "headscope.workflows.ablation",
    "dla": "headscope.workflows.mechanisms",
    "qk": "headscope.workflows.mechanisms",
    "composition": "headscope.workflows.mechanisms",
    "patch": "headscope.workflows.mechanisms",
    "attribution_patch": "headscope.workflows.mechanisms",
    "mechanisms": "headscope.workflows.mechanisms",
    "PatchPair": "headscope.analyses.patching",
    "builtin_pairs": "headscope.analyses.patching",
    "read_pairs": "headscope.analyses.patching",
    "sinks": "headscope.workflows.sinks",
    "streaming": "headscope.workflows.sinks",
    "retrieval": "headscope.workflows.retrieval",
    "plan_cost": "headscope.workflows.retrieval",
    "needle_hits": "headscope.workflows.retrieval",
    "compare_models": "headscope.workflows.compare",
    "comparison_report": "headscope.workflows.compare",
    "analyse_model": "headscope.workflows.run",
    "analyse_models": "headscope.workflows.run",
    "RunSettings": "headscope.workflows.run",
    "corpus_stats": "headscope.workflows.run",
    "REPORT_SENTENCES": "headscope.workflows.run",
    "DEFAULT_TARGETS": "headscope.workflows.run",
    # data
    "builtin_corpus": "headscope.analyses.corpus",
    "read_corpus": "headscope.analyses.corpus",
    "builtin_set": "headscope.analyses.relations",
    "read_probe_file": "headscope.analyses.relations",
    # results
    "AttentionMap": "headscope.probe.types",
    "CrossAttentionMap": "headscope.probe.types",
    "Seq2SeqAttention": "headscope.probe.types",
    "Verification": "headscope.probe.results",
    "Explanation": "headscope.probe.results",
    "GenerationAttention": "headscope.probe.results",
    "HeadScores": "headscope.analyses.heads",
    "ProbeScores": "headscope.analyses.coref",
    "ProbeResult": "headscope.analyses.coref",
    "RelationExample": "headscope.analyses.relations",
    "HeadComparison": "headscope.analyses.compare",
    "AblationResult": "headscope.analyses.ablation",
    "AblationEvidence": "headscope.analyses.evidence",
    "DLAResult": "headscope.probe.results",
    "QKAttribution": "headscope.probe.results",
    "CompositionScores": "headscope.probe.results",
    "PatchResult": "headscope.analyses.patching",
    "MechanismsReport": "headscope.analyses.mechanisms",
    "SinkReport": "headscope.analyses.sinks",
    "SinkRate": "headscope.analyses.sinks",
    "StreamingResult": "headscope.analyses.sinks",
    "KVPlan": "headscope.probe.kvplan",
    "RetrievalResult": "headscope.analyses.longcontext",
    "RetrievalCheck": "headscope.analyses.longcontext",
    "RetrievalScores": "headscope.analyses.longcontext",
    "Phrasing": "headscope.probe.kvplan",
    "rollout": "headscope.analyses.flow",
    "flow": "headscope.analyses.flow",
    # reports
    "ModelAnalysis": "headscope.reports.analysis",
    "report": "headscope.reports.folder",
    "versions": "headscope.reports.folder",
    "plot": "headscope.reports",
    "show": "headscope.reports",
    # the choices, named once (`probe.names`)
    "Level": "headscope.probe.names",
    "Weight": "headscope.probe.names",
    "Attention": "headscope.probe.names",
    "DEFAULT_ATTENTION": "headscope.probe.names",
    "DEFAULT_LEVEL": "headscope.probe.names",
    "DEFAULT_INCLUDE_SPECIAL": "headscope.probe.names",
    "DEFAULT_ABLATION_METHOD": "headscope.probe.names",
}

# Old public names, kept for one release: each warns once per use and answers with its new name.
# ("causal" now means only a decoder's mask, `lm.is_causal`; what ablation shows is ablation evidence.)
_RENAMED: dict[str, str] = {
    "causal": "ablate_chosen_head",
    "causal_evidence": "ablation_evidence",
    "CausalEvidence": "AblationEvidence",
}

__all__ = ["__version__", *_HOMES]


def __getattr__(name: str):
    if name in _RENAMED:
        new = _RENAMED[name]
        warnings.warn(f"headscope.{name} is now headscope.{new}; the old name goes in the next release",
                      DeprecationWarning, stacklevel=2)
        return __getattr__(new)
    if name not in _HOMES:
        raise AttributeError(f"module 'headscope' has no attribute {name!r}")
    home = _HOMES[name]
    module, attribute = (home, name) if isinstance(home, str) else home
    return getattr(importlib.import_module(module), attribute)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOMES))
