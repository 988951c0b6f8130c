"""The report's contract, declared once: `ModelAnalysis`, everything found about one model.

`headscope.analyse_model` (the `headscope run` pipeline) fills one; `compare --report` fills two;
anyone can build one from results they computed themselves. `reports.build_report` and
`reports.folder.report` take a sequence of them (models side by side); each section of the page
(`reports.sections.SECTIONS`) reads the fields it needs, and `to_dict()` is the model's run.json
entry. Every field is a result (maps, scores, tables) — never a model — and any may be missing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any, Mapping

from headscope.probe.words import to_word_level

if TYPE_CHECKING:
    import pandas as pd

    from headscope.analyses.evidence import AblationEvidence
    from headscope.analyses.longcontext import RetrievalResult
    from headscope.analyses.mechanisms import MechanismsReport
    from headscope.analyses.sinks import SinkReport, StreamingResult
    from headscope.analyses.compare import HeadComparison
    from headscope.analyses.coref import ProbeResult
    from headscope.analyses.heads import HeadScores
    from headscope.analyses.syntax import SyntaxResult
    from headscope.probe.results import GenerationAttention, Verification
    from headscope.probe.types import AttentionMap, Seq2SeqAttention

__all__ = ["ModelAnalysis"]


@dataclass(frozen=True, eq=False)
class ModelAnalysis:
    """Everything the report shows about one model, and its run.json entry (`to_dict`)."""

    model: str
    verification: Verification | None = None  # None where it could not run (the notes say why)
    scores: HeadScores | None = None
    probes: tuple[ProbeResult, ...] = ()  # the combined one first when there are several sets
    maps: tuple[AttentionMap, ...] = ()  # the report sentences, token level (the page adds their word level)
    pairs: tuple[Seq2SeqAttention, ...] = ()  # encoder–decoder models: each sentence with its target, token level
    norm_maps: tuple[AttentionMap, ...] = ()  # the sentences' norm-based weights, token level (or none)
    generations: tuple[GenerationAttention, ...] = ()  # decoders: tokens generated after each sentence
    corpus: pd.DataFrame | None = None  # corpus statistics, one row per corpus
    syntax: SyntaxResult | None = None  # the Syntax section (a treebank was given)
    syntax_clusters: pd.DataFrame | None = None  # its heads embedded by attention distance
    evidence: AblationEvidence | None = None  # ablation evidence, or None where it was not run
    comparison: HeadComparison | None = None  # this model (B) against the model it is compared with (A)
    sinks: SinkReport | None = None  # the Sinks section (`run --sinks`)
    streaming: StreamingResult | None = None  # its StreamingLLM test (decoders)
    mechanisms: MechanismsReport | None = None  # the Mechanisms section (`run --mechanisms`)
    long_context: RetrievalResult | None = None  # the Long context section (`run --long-context`)
    # the Vision–language section: a vision–language decoder's maps over texts with images (image tokens carry
    # `patches`), and optionally each map's value norms [layer, head, key] (`probe.sinks.head_internals`) or None
    vision_language: tuple[AttentionMap, ...] = ()
    vision_language_value_norms: tuple[Any, ...] = ()
    # a decoder that reads its images through cross-attention layers (Mllama): each text's self-attention and
    # cross-attention maps (`probe.types.ImageCrossAttention`), shown in the Vision–language section
    image_cross: tuple[Any, ...] = ()
    info: Mapping[str, Any] = field(default_factory=dict)  # family, layers, heads, dtype, source, timings
    notes: tuple[str, ...] = ()  # problems to show prominently (a stage that could not run, ...)
    seconds: Mapping[str, float] = field(default_factory=dict)  # wall time of each stage

    def __post_init__(self) -> None:
        for name in ("pairs", "norm_maps"):
            given = getattr(self, name)
            if given and len(given) != len(self.maps):
                raise ValueError(f"{len(given)} {name.replace('_', ' ')} for {len(self.maps)} sentences; give one per "
                                 "sentence, or none")
        if self.vision_language_value_norms and len(self.vision_language_value_norms) != len(self.vision_language):
            raise ValueError(f"{len(self.vision_language_value_norms)} value norms for {len(self.vision_language)} "
                             "vision–language maps; give one per map (None where there are none), or none")
        if any(not any(p is not None for p in m.patches) for m in self.vision_language):
            raise ValueError("every vision_language map needs image tokens (AttentionMap.patches); give the maps of "
                             "texts with images")

    # -- the levels the page draws (derived once: the report shows words and tokens) --------------

    @cached_property
    def word_maps(self) -> tuple[AttentionMap, ...]:
        """The report sentences at word level, when every token knows its word (else none)."""
        return _word_level(self.maps)

    @cached_property
    def word_pairs(self) -> tuple[Seq2SeqAttention, ...]:
        """Encoder–decoder pairs at word level, when both sides' tokens know their words (else none)."""
        if self.pairs and all(_word_level((p.encoder, p.decoder)) for p in self.pairs):
            return tuple(to_word_level(p) for p in self.pairs)
        return ()

    @cached_property
    def shown_norm_maps(self) -> tuple[AttentionMap, ...]:
        """The norm-based weights at one level: words where they can be, else tokens (the page stays small)."""
        return _word_level(self.norm_maps) or self.norm_maps

    @property
    def heatmap_maps(self) -> tuple[AttentionMap, ...]:
        """The sentences at the probe's level (words when there is no probe)."""
        level = self.probes[0].level if self.probes else "word"
        return self.word_maps if level == "word" and self.word_maps else self.maps

    @property
    def verified(self) -> bool:
        return self.verification is not None and self.verification.passed

    def to_dict(self) -> dict:
        """The run.json entry of this model (with "syntax", "sinks", "mechanisms" and "vision_language" only when
        those analyses ran)."""
        v = self.verification
        record = {
            "model": self.model, "info": dict(self.info),
            "verification": None if v is None else v.to_dict(),
            "verified": self.verified,
            "heads": None if self.scores is None else self.scores.to_dict(table=False),
            "probes": [{k: val for k, val in p.to_dict().items() if k != "heads"} for p in self.probes],
            "notes": list(self.notes), "seconds": dict(self.seconds),
            **({"generated": [{"prompt": g.prompt.text, "text": g.text, "stopped": g.stopped} for g in self.generations]}
               if self.generations else {}),
            "ablation": None if self.evidence is None or self.scores is None else self.evidence.to_dict(self.scores),
        }
        if self.syntax is not None:
            record["syntax"] = self.syntax.to_dict()
        if self.sinks is not None or self.streaming is not None:
            record["sinks"] = {"analysis": None if self.sinks is None else self.sinks.to_dict(),
                               "streaming": None if self.streaming is None else self.streaming.to_dict()}
        if self.mechanisms is not None:
            record["mechanisms"] = self.mechanisms.to_dict()
        if self.long_context is not None:
            record["long_context"] = self.long_context.to_dict()
        if self.vision_language:
            record["vision_language"] = [{"text": m.text, "images": len(m.pictures),
                                          "image_tokens": sum(p is not None for p in m.patches)}
                                         for m in self.vision_language]
        if self.image_cross:
            record["image_cross"] = [{"text": p.text, "images": len(p.decoder.pictures), "cross_layers":
                                      list(p.cross.layer_ids), "image_keys": len(p.cross.keys)}
                                     for p in self.image_cross]
        return record


def _word_level(maps) -> tuple:
    """`maps` at word level when every token of every map knows its word, else ()."""
    if maps and all(len(m.word_index) == len(m) for m in maps):
        return tuple(to_word_level(m) for m in maps)
    return ()
