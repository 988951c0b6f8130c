"""headscope: real attention from pretrained models, verified from scratch, analysed head by head.

    >>> import headscope as hs                                                   # doctest: +SKIP
    >>> lm = hs.load("minilm")                                                   # doctest: +SKIP
    >>> maps = hs.extract(lm, ["The animal didn't cross the street because it was too tired."], level="word")  # doctest: +SKIP
    >>> hs.verify(lm).passed, hs.heads(lm, hs.builtin_corpus()[:20]).top("previous_token", 3)  # doctest: +SKIP

Importing headscope loads no model, reads no file and does not import torch: the workflows in
`headscope.api` import what they need when they run, and the result types below are looked up
on first use.
"""

__version__ = "0.1.0"

from .api import (  # noqa: E402
    REPORT_SENTENCES,
    ModelAnalysis,
    RunSettings,
    analyse_model,
    builtin_corpus,
    builtin_set,
    causal,
    corpus_stats,
    coref,
    explain,
    extract,
    extract_scores,
    heads,
    induction_inputs,
    load,
    probe_sets,
    read_corpus,
    read_probe_file,
    relation_probe,
    verify,
    versions,
)

# Result types and the workflows that live in their own module, imported from their home module on
# first use (they need torch).
_LAZY = {
    "LoadedModel": "headscope.probe.model",
    "AttentionMap": "headscope.probe.types",
    "CrossAttentionMap": "headscope.probe.types",
    "Seq2SeqAttention": "headscope.probe.types",
    "Verification": "headscope.probe.verify",
    "Explanation": "headscope.probe.explain",
    "HeadScores": "headscope.analyses.heads",
    "ProbeScores": "headscope.analyses.coref",
    "ProbeResult": "headscope.analyses.coref",
    "RelationExample": "headscope.analyses.relations",
    "HeadComparison": "headscope.analyses.compare",
    "GenerationAttention": "headscope.generate",
    "compare_models": "headscope.compare",
    "generate_attention": "headscope.generate",
    "from_hf": "headscope.probe.interop",
    "from_transformer_lens": "headscope.probe.interop",
    "long_frame": "headscope.probe.interop",
    "plot": "headscope.reports",
    "ablate": "headscope.ablation",
    "ablate_each": "headscope.ablation",
    "importance": "headscope.ablation",
    "norm_attention": "headscope.ablation",
    "Cloze": "headscope.ablation",
    "InductionTask": "headscope.ablation",
    "Choice": "headscope.ablation",
    "choice_check": "headscope.ablation",
    "causal_evidence": "headscope.ablation",
    "CausalEvidence": "headscope.analyses.causal",
    "AblationResult": "headscope.analyses.ablation",
    "syntax_clusters": "headscope.syntax",
    "rollout": "headscope.analyses.flow",
    "flow": "headscope.analyses.flow",
    "show": "headscope.reports",
}

__all__ = [
    "__version__", "load", "extract", "verify", "explain", "heads", "induction_inputs", "extract_scores", "coref",
    "relation_probe", "probe_sets", "causal", "corpus_stats", "versions", "builtin_corpus", "builtin_set",
    "read_corpus", "read_probe_file", "analyse_model", "ModelAnalysis", "RunSettings", "REPORT_SENTENCES",
    *_LAZY,
]


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'headscope' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
