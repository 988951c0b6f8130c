"""One model, everything: the `headscope run` pipeline, as a function that returns a `ModelAnalysis`.

    analyse_model(lm, texts, sets, settings)
        verify            every layer recomputed from scratch (`probe.verify`)
        heads             every head over the corpus (`workflows.heads`)
        coref             the probe sets (`workflows.relations.probe_sets`)
        ablation          ablation evidence where asked for, or cheap (`workflows.ablation.ablation_evidence`)
        sentences         the report sentences' maps, norm weights, encoder–decoder pairs
        generate          decoders: tokens generated after each sentence (`probe.generate`)
        syntax            with a treebank: relations, trees, head clusters (`workflows.syntax`)
        sinks             where asked for: sink rate, sink heads, massive activations, StreamingLLM (`workflows.sinks`)
        mechanisms        where asked for: DLA of the sentences' next tokens, composition, patching (`workflows.mechanisms`)
    -> reports.analysis.ModelAnalysis: the input of `hs.report` (the page, its tables, run.json)

`RunSettings` records what a run did. An architecture that cannot be verified is noted, not fatal.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterator, Mapping, Sequence

import pandas as pd

from headscope.analyses.flow import FLOW_MAX_EDGES, flow_fits
from headscope.analyses.heads import score_corpus
from headscope.analyses.treebank import Treebank
from headscope.probe.encoding import fit_context, refuse_unfilled_slots
from headscope.probe.forward import hybrid_note, is_seq2seq
from headscope.probe.families import UnsupportedArchitecture, UnsupportedFeature
from headscope.probe.generate import GenerationAttention, generate_attention
from headscope.probe.images import for_input, is_two_tower, models_for, require_modality
from headscope.probe.inputs import AttentionInput
from headscope.probe.vision_language import DEFAULT_PROMPT
from headscope.probe.model import LoadedModel
from headscope.probe.names import DEFAULT_ATTENTION, Attention
from headscope.probe.sources import source_for
from headscope.probe.types import ImageCrossAttention
from headscope.probe.verify import Verification, verify
from headscope.probe.words import word_spans
from headscope.reports.analysis import ModelAnalysis

from .ablation import ablation_evidence
from .mechanisms import mechanisms
from .heads import heads
from .relations import probe_sets
from .sinks import default_streaming_text, sinks, streaming
from .syntax import syntax, syntax_clusters
from headscope.probe.wording import counted

__all__ = ["RunSettings", "analyse_model", "analyse_models", "corpus_stats", "REPORT_SENTENCES", "DEFAULT_TARGETS", "settings_display"]

# The sentences of the explorer and the attention figures: the it -> animal sentence, its "too
# wide" twin (where "it" is the street), and the textbook 我爱北京天安门.
REPORT_SENTENCES = (
    "The animal didn't cross the street because it was too tired.",
    "The animal didn't cross the street because it was too wide.",
    "我爱北京天安门",
)

# What an encoder–decoder model's decoder reads when no targets are given: each report sentence itself
# (teacher-forced, as if it were the model's own output), so cross-attention has something to show.
DEFAULT_TARGETS = "each report sentence itself (no --target given)"


def settings_display(settings: Mapping[str, Any]) -> dict[str, Any]:
    """`settings` as the report's settings list shows them: a setting left unset (None; run.json records null)
    says what the run did instead of an empty row.

    >>> settings_display({"limit": None, "memory_budget": 2 * 10**9, "ablation": None, "seed": 0})["limit"]
    'none (every text)'
    """
    from headscope.probe.sources import memory_budget

    unset = {"limit": lambda: "none (every text)",
             "memory_budget": lambda: f"a quarter of RAM ({memory_budget() / 1e9:.1f} GB)",
             "ablation": lambda: "encoders only (one pass per head is cheap there; a decoder needs --ablation)"}
    return {k: unset[k]() if v is None and k in unset else v for k, v in settings.items()}


@dataclass(frozen=True)
class RunSettings:
    """What a run did, as recorded in run.json and the report."""

    corpus: str  # "built-in" or a path
    coref: str  # "built-in (agreement, winograd)" or a path
    texts: tuple[str, ...]
    level: str = "word"
    include_special: bool = True
    limit: int | None = None
    induction_sequences: int = 20
    permutations: int = 10_000
    folds: int = 5
    seed: int = 0
    batch_size: int = 8
    device: str = "cpu"
    dtype: str = "float32"
    max_memory: dict | None = None  # accelerate's budget, bytes per GPU number / "cpu" (`--max-memory`)
    offload_folder: str | None = None  # where the layers that fit nowhere went (`--offload-folder`)
    truncate: bool = False
    attention: Attention = DEFAULT_ATTENTION
    memory_budget: int | None = None  # bytes; None: a quarter of RAM (`probe.sources.memory_budget`)
    # An encoder–decoder model's decoder texts, one per report sentence; none: each sentence is its own
    # target (`DEFAULT_TARGETS`). One-stack models ignore them.
    targets: tuple[str, ...] = ()
    # Decoders: greedily generate this many tokens after each report sentence and record each new token's
    # attention (`probe.generate`), which the report's explorer steps through; 0: none.
    generate: int = 0
    conllu: str | None = None  # a CoNLL-U treebank: the report gains a Syntax section (scored on it)
    select_on: str | None = None  # a second treebank to choose the syntax heads on (else a seeded half of conllu)
    # Ablation evidence (`workflows.ablation.ablation_evidence`): None = where it is cheap, i.e. for encoders (one
    # forward pass per head over `ablation_texts` texts: seconds for minilm); a decoder adds an LM head
    # per pass, the induction ablation and three cloze checks (minutes on a CPU), so only with True.
    ablation: bool | None = None
    ablation_texts: int = 32
    ablation_random: int = 19
    ablation_examples: int = 40
    induction_k: int = 5
    # The Sinks section (`workflows.sinks`): sink rate, sink heads and their dormant calls (mean ablation on
    # `ablation_texts` texts), massive activations, and for decoders the StreamingLLM test on the first
    # `streaming_tokens` tokens of the UD English EWT text in the shared data (skipped, with a note, without it).
    sinks: bool = False
    streaming_tokens: int = 1024
    streaming_window: int = 256
    # The Mechanisms section (`workflows.mechanisms.mechanisms`): DLA of each report sentence's next token and
    # head-output patching of `mechanisms_pairs` pairs of the built-in `ioi` set (decoders), and the composition
    # scores of every pair of heads (any model).
    mechanisms: bool = False
    mechanisms_pairs: int = 8
    # The Long context section (`workflows.retrieval.run_section`, decoders): retrieval heads on needle prompts,
    # the causal check and the KV-cache plans' cost curve.
    long_context: bool = False
    # Vision transformers: the images analysed instead of the corpus, the probes and the report sentences
    # (their maps are the report's maps, scored with the vision metrics); text models take none.
    images: tuple[str, ...] = ()


class _Stages:
    """Wall time of each named stage, in seconds."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def run(self, name: str, fn, *args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            self.seconds[name] = round(time.perf_counter() - t0, 3)


def flow_notes(maps: Sequence) -> list[str]:
    """A note for each report sentence whose attention flow is too large to draw (`analyses.flow.flow_fits`)."""
    notes = []
    for i, amap in enumerate(maps):
        if not flow_fits(amap.attention):
            L, _, T, _ = amap.attention.shape
            notes.append(f"attention flow not drawn for sentence {i + 1} ({T} tokens): {L} layers × {T}² tokens is "
                         f"{L * T * T:,} edges, over the limit of {FLOW_MAX_EDGES:,}; its rollout is drawn")
    return notes


def analyse_model(lm: LoadedModel, texts: Sequence[str], sets: Sequence[tuple[str, list]], settings: RunSettings,
                  *, load_seconds: float = 0.0, progress: bool = False,
                  log: Callable[[str], None] | None = None, conllu: Treebank | None = None,
                  select_on: Treebank | None = None, world=None) -> ModelAnalysis:
    """Verification, head scores over `texts`, the probe sets `[(task, examples), ...]` (none: no probe stage
    and no probe section in the report) and the maps of the report sentences, for one loaded model; with `settings.conllu`, the syntax analysis
    (`workflows.syntax`) and its head clusters, labelled by the head scores' roles.

    An architecture that cannot be verified is noted, not fatal. `log` receives one line per
    finished stage; `progress` shows bars on stderr. `conllu` / `select_on`: the treebanks of
    `settings.conllu` / `settings.select_on` already read (`analyses.treebank.Treebank`), so that
    several models need not read them again; by default they are read from those paths.
    `world` (a torchrun run): the corpus of the head scores and the probe examples are sharded over
    the processes (`heads`, `probe_sets`); verification and the report sentences run whole on every process.

    >>> from headscope.probe.tiny import tiny_model
    >>> from headscope.analyses.relations import builtin_set
    >>> s = RunSettings(corpus="c", coref="p", texts=("The cat sat.",), permutations=100, induction_sequences=0)
    >>> a = analyse_model(tiny_model("bert"), ["A dog ran."] * 4, [("t", builtin_set("agreement")[:16])], s)
    >>> a.verification.passed, [p.task for p in a.probes], len(a.maps)
    (True, ['t'], 1)
    """
    say = log or (lambda message: None)
    stage = _Stages()
    stage.seconds["load"] = round(load_seconds, 3)
    if settings.images or getattr(lm, "is_image", False) or is_two_tower(lm):
        lm = for_input(lm, images=bool(settings.images))  # a two-tower model: the tower that reads this input
        if settings.images:
            return _analyse_images(lm, settings, stage, say)
    refuse_unfilled_slots(lm, settings.texts)  # the report sentences are read last: say it before minutes of work
    notes: list[str] = [note for note in [hybrid_note(lm)] if note]
    verification: Verification | None
    try:
        say(f"{lm.name}: verifying its attention against a from-scratch recomputation ...")
        verification = stage.run("verify", verify, lm, truncate=settings.truncate)
        say(f"{lm.name}: {verification.summary()} ({stage.seconds['verify']:.1f} s)")
    except (UnsupportedArchitecture, UnsupportedFeature) as exc:
        verification = None
        notes.append(f"verification could not run: {exc}")
        say(f"{lm.name}: verification could not run: {exc}")

    scores = stage.run("heads", heads, lm, texts, level=settings.level, include_special=settings.include_special,
                       batch_size=settings.batch_size, induction_sequences=settings.induction_sequences,
                       seed=settings.seed, truncate=settings.truncate, progress=progress, total=len(texts),
                       attention=settings.attention, budget=settings.memory_budget, world=world)
    scores.meta["corpus"] = settings.corpus
    say(f"{lm.name}: head scores over {counted(scores.n_texts, 'text')}, {counted(len(scores.roles), 'role')} "
        f"({stage.seconds['heads']:.1f} s)")
    if how := scores.meta.get("attention"):  # the mode chosen (also in run.json: the heads' meta)
        say(f"{lm.name}: attention {how['asked']}: {counted(how['eager'], 'text')} eager, {how['recompute']} recomputed in "
            f"blocks (memory budget {how['budget'] / 1e9:.2f} GB)")
    if scores.meta.get("check"):
        say(f"{lm.name}: {scores.meta['check']['summary']}")

    probes: list = []
    if sets:  # no probe sets: no probe stage, and the report has no probe section
        main, parts = stage.run("coref", probe_sets, lm, sets,
                                combined_task="coref-builtin", level=settings.level, folds=settings.folds,
                                n_perm=settings.permutations, seed=settings.seed, batch_size=settings.batch_size,
                                noun="pronouns", attention=settings.attention, budget=settings.memory_budget,
                                world=world, progress=progress)
        probes = [main, *parts]  # the combined result first when there are several sets
        say(f"{lm.name}: coreference probe ({stage.seconds['coref']:.1f} s)")
    for p in probes:
        if not p.n:  # its tables would be empty and its rates nan
            why = "; ".join(f"{v} × {k}" for k, v in p.excluded.items()) or "none was kept"
            notes.append(f"probe {p.task}: nothing to score, no example could be scored ({why})")
    for p in probes:
        say(f"  {p.task}: {p.verdict}")

    evidence = None
    if settings.ablation and is_seq2seq(lm):  # the ablation effects read one stack's output (an LM loss or an embedding)
        notes.append("ablation evidence was not run: head ablation covers encoders and decoders, not encoder-decoder "
                     "models")
    elif settings.ablation or (settings.ablation is None and not lm.is_causal and not is_seq2seq(lm)):
        ablation_texts = [fit_context(lm, t) if settings.truncate else t for t in texts[: settings.ablation_texts]]
        evidence = stage.run("ablation", ablation_evidence, lm, ablation_texts, scores, probes, method="zero",
                             n_random=settings.ablation_random, induction_k=settings.induction_k,
                             cloze_examples=settings.ablation_examples, seed=settings.seed,
                             batch_size=settings.batch_size, progress=progress)
        say(f"{lm.name}: ablation evidence, every head ablated alone on {counted(evidence.n_texts, 'text')} "
            f"({stage.seconds['ablation']:.1f} s)")

    maps, pairs, norm_maps = stage.run("sentences", _report_attention, lm, settings)
    notes.extend(flow_notes(maps))
    generations: tuple[GenerationAttention, ...] = ()
    if settings.generate and lm.is_causal:
        generations = stage.run("generate", _generations, lm, settings)
        say(f"{lm.name}: {settings.generate} tokens generated after each report sentence "
            f"({stage.seconds['generate']:.1f} s)")
    elif settings.generate:
        notes.append(f"generation was not run ({settings.generate} tokens asked for): {lm.name} is not a decoder, "
                     "and only decoders continue a text")
    sentences = "--text" if settings.texts != REPORT_SENTENCES else "built-in"
    corpus = corpus_stats(lm.tokenizer, [("heads corpus", settings.corpus, texts),
                                          *[(f"probe: {task}", settings.coref, [e.text for e in exs])
                                            for task, exs in sets],
                                          ("report sentences", sentences, list(settings.texts))])
    found, clusters = None, None
    if settings.conllu is not None:
        found, clusters = _syntax_stages(lm, stage, settings, scores.roles, settings.conllu if conllu is None else conllu,
                                         settings.select_on if select_on is None else select_on, progress=progress)
        say(f"{lm.name}: syntax on {found.n_sentences} test sentences ({stage.seconds['syntax']:.1f} s), "
            f"{len(clusters)} heads clustered ({stage.seconds['syntax_clusters']:.1f} s)")
    sink_report, streamed = None, None
    if settings.sinks and is_seq2seq(lm):
        notes.append("the sinks analysis was not run: it covers encoders and decoders, not encoder-decoder models")
    elif settings.sinks:
        sink_report = stage.run("sinks", sinks, lm, texts, ablation_texts=settings.ablation_texts,
                                n_random=settings.ablation_random, seed=settings.seed, batch_size=settings.batch_size,
                                progress=progress)
        say(f"{lm.name}: sink rate {sink_report.sink_rate.value:.1%} ({stage.seconds['sinks']:.1f} s)")
        found_text = default_streaming_text() if lm.is_causal else None
        if lm.is_causal and found_text is None:
            notes.append("the StreamingLLM test was not run: no UD English EWT text in the shared data")
        elif found_text is not None:
            # A model whose context is short (a tiny test model's 128 positions) gets a window of a quarter of it:
            # a window reaching every key would only repeat dense attention (streaming refuses it).
            tokens = min(settings.streaming_tokens, lm.max_length or settings.streaming_tokens)
            streamed = stage.run("streaming", streaming, lm, found_text[0],
                                 window=min(settings.streaming_window, max(1, tokens // 4)), keep=4,
                                 max_tokens=settings.streaming_tokens, source=found_text[1])
            say(f"{lm.name}: StreamingLLM test, perplexity dense {streamed.dense_ppl:.2f}, window "
                f"{streamed.window_ppl:.2f}, window + 4 sinks {streamed.sink_window_ppl:.2f} "
                f"({stage.seconds['streaming']:.1f} s)")
    found_mechanisms = None
    if settings.mechanisms and is_seq2seq(lm):
        notes.append("the mechanisms analysis was not run: it covers encoders and decoders, not encoder-decoder models")
    elif settings.mechanisms:
        found_mechanisms = stage.run("mechanisms", mechanisms, lm, settings.texts, n_pairs=settings.mechanisms_pairs,
                                     seed=settings.seed)
        say(f"{lm.name}: mechanisms, " + ", ".join(f"{k} {v:.1f} s" for k, v in found_mechanisms.seconds.items())
            + f" ({stage.seconds['mechanisms']:.1f} s)")
    found_long = None
    if settings.long_context:
        found_long = _long_context(lm, stage, settings, notes, say, progress)
    info = _model_info(lm, verification, stage.seconds)
    if pairs:
        info["targets"] = "given" if settings.targets else DEFAULT_TARGETS
    return ModelAnalysis(model=lm.name, verification=verification, scores=scores, probes=tuple(probes),
                         maps=tuple(maps), corpus=corpus, info=info, notes=tuple(notes), seconds=dict(stage.seconds),
                         pairs=tuple(pairs), norm_maps=tuple(norm_maps), generations=tuple(generations),
                         syntax=found, syntax_clusters=clusters, evidence=evidence, sinks=sink_report,
                         streaming=streamed, mechanisms=found_mechanisms, long_context=found_long)


def _long_context(lm: LoadedModel, stage: _Stages, settings: RunSettings, notes: list, say, progress: bool):
    """The Long context section's result, or None with a note (not a decoder, no layer to plan)."""
    from .retrieval import run_section

    if not lm.is_causal:
        notes.append(f"the long-context analysis was not run: {lm.name} is not a decoder (a KV-cache plan is a "
                     "decoder's)")
        return None
    try:
        found = stage.run("long_context", run_section, lm, seed=settings.seed, progress=progress)
    except (UnsupportedFeature, ValueError) as exc:
        notes.append(f"the long-context analysis was not run: {exc}")
        return None
    say(f"{lm.name}: long context, {found.check.verdict} ({stage.seconds['long_context']:.1f} s)")
    return found


def analyse_models(lm: LoadedModel, texts: Sequence[str], sets: Sequence[tuple[str, list]], settings: RunSettings, *,
                   sentences_given: bool = False, check: Callable[[LoadedModel], None] | None = None,
                   **options) -> Iterator[ModelAnalysis]:
    """`analyse_model` of every model a run analyses in `lm`: a two-tower model's image tower for `settings.images`
    and its text tower for the report sentences (`sentences_given`: the caller gave its own) or when no image is
    given, each analysed and reported apart; any other model itself, once it takes the input (an image on a text
    model, or no image for an image model, is a ValueError). `check(model)` runs on each model that reads texts
    before it is analysed (a caller's own checks of the corpus). What `headscope run` calls for each model."""
    images = bool(settings.images)
    for part in models_for(lm, images=images, texts=sentences_given):
        is_image = getattr(part, "is_image", False)  # a LoadedModel's; a stand-in of the tests may lack it
        if is_image != images and part is lm:  # an image on a text model, or a text-only image run
            require_modality(lm, images=images)
        if not is_image and check is not None:
            check(part)
        yield analyse_model(part, texts, sets, settings if is_image or part is lm else replace(settings, images=()),
                            **options)
        del part


def _analyse_images(lm: LoadedModel, settings: RunSettings, stage: _Stages, say) -> ModelAnalysis:
    """A vision transformer's run: verification on the images, their maps (patch units) and every head
    scored on them (the vision metrics among the rest). No corpus, probe, ablation or sinks: those read texts."""
    images = list(settings.images)
    verification = stage.run("verify", verify, lm, images=images, batch_size=settings.batch_size)
    say(f"{lm.name}: {verification.summary()} ({stage.seconds['verify']:.1f} s)")
    source = source_for(lm, settings.attention, budget=settings.memory_budget, batch_size=settings.batch_size)
    maps = stage.run("images", source.maps, AttentionInput.of(images=images), level="token")
    image_cross = tuple(m for m in maps if isinstance(m, ImageCrossAttention))  # Mllama: self and cross maps apart
    if image_cross:
        maps = [p.decoder for p in image_cross]  # the self-attention layers' maps: scored and explored as texts
    # the maps stay token level for the figures; the scores are at the run's level (a vision–language text's
    # words; an image model's patches are its units at both levels)
    scores = stage.run("heads", score_corpus, maps, model=lm.name, level=settings.level,
                       include_special=settings.include_special,
                       meta={"corpus": f"{len(images)} image(s)"})
    say(f"{lm.name}: head scores over {counted(len(maps), 'image')}, {counted(len(scores.roles), 'role')} ({stage.seconds['heads']:.1f} s)")
    notes = ["an image model: the heads are scored on the --image files, and the corpus, the coreference probe, "
             "ablation and sinks (which read texts) were not run; CLIP and SigLIP towers never attend to each other "
             "(there is no cross-attention between image and text)"]
    if lm.source == "random init":
        notes.append("random weights (a tiny test model): the vision figures show the method, not a trained model")
    info = {**_model_info(lm, verification, stage.seconds), "images": [m.text for m in maps]}
    if maps[0].grid is not None:
        info["patch_grid"] = list(maps[0].grid)
    reading = {}
    if getattr(lm, "reads_images", False):  # a vision–language decoder: each image read with a prompt
        notes[0] = ("a vision–language decoder: each --image is read with the prompt "
                    f"{DEFAULT_PROMPT!r} and the heads are scored on those texts; the corpus, the coreference probe, "
                    "ablation and sinks were not run")
        info["images"] = list(images)
        # the Vision–language section's maps (a cross-attention reader's pairs: its cross maps over the picture)
        reading = {"image_cross": image_cross} if image_cross else {"vision_language": tuple(maps)}
        if settings.generate:  # each image's prompt continued: every new token's row over the picture
            reading["generations"] = stage.run("generate", lambda: tuple(
                generate_attention(lm, DEFAULT_PROMPT, images=[image], max_new_tokens=settings.generate)
                for image in images))
            say(f"{lm.name}: {settings.generate} tokens generated after each image's prompt "
                f"({stage.seconds['generate']:.1f} s)")
    if settings.generate and not getattr(lm, "reads_images", False):
        notes.append(f"generation was not run ({settings.generate} tokens asked for): {lm.name} is an image encoder, "
                     "and only decoders continue a text")
    return ModelAnalysis(model=lm.name, verification=verification, scores=scores, maps=tuple(maps), info=info,
                         notes=tuple(notes), seconds=dict(stage.seconds), **reading)


def corpus_stats(tokenizer, corpora: Sequence[tuple[str, str, Sequence[str]]]) -> pd.DataFrame:
    """One row per `(name, source, texts)`: texts, words, tokens (with special tokens), tokens per
    word, longest text -> DataFrame. `tokenizer` is any Hugging Face tokenizer.

    >>> from headscope.probe.tiny import tiny_model
    >>> corpus_stats(tiny_model("bert").tokenizer, [("c", "here", ["The cat sat.", "Hi"])])[["texts", "words"]].values.tolist()
    [[2, 5]]
    """
    rows = []
    for name, source, texts in corpora:
        texts = list(texts)
        tokens = [len(ids) for ids in tokenizer(texts)["input_ids"]] if texts else []
        words = [len(word_spans(t)) for t in texts]
        rows.append({
            "corpus": name, "source": source, "texts": len(texts), "words": sum(words), "tokens": sum(tokens),
            "tokens_per_word": sum(tokens) / max(sum(words), 1),
            "mean_tokens": sum(tokens) / max(len(texts), 1), "max_tokens": max(tokens, default=0),
        })
    return pd.DataFrame(rows)


def _generations(lm: LoadedModel, settings: RunSettings) -> tuple[GenerationAttention, ...]:
    return tuple(generate_attention(lm, text, max_new_tokens=settings.generate) for text in settings.texts)


def _report_attention(lm: LoadedModel, settings: RunSettings) -> tuple[list, list, list]:
    """The report sentences' maps (token level; whole maps, the figures draw every head), their norm-based
    weights (none for an architecture whose attention cannot be recomputed) and, for an encoder–decoder
    model, each sentence with its target (`settings.targets`, else itself): `(maps, pairs, norm_maps)`."""
    texts = list(settings.texts)
    source = source_for(lm, settings.attention, budget=settings.memory_budget, batch_size=8)
    maps = source.maps(texts, level="token", truncate=settings.truncate)
    # the norm weights and the pairs come from the eager forward pass: a source that refuses them (recompute)
    # leaves the few short report sentences to the eager source, as it always has
    eager = source if source.accepts("norm") else source_for(lm, "eager", budget=settings.memory_budget, batch_size=8)
    try:
        norm_maps = eager.maps(texts, level="token", weight="norm", truncate=settings.truncate)
    except (UnsupportedArchitecture, UnsupportedFeature):
        norm_maps = []
    if not is_seq2seq(lm):
        return maps, [], norm_maps
    targets = list(settings.targets) or texts
    if len(targets) != len(texts):
        raise ValueError(f"{len(targets)} targets for {len(texts)} report sentences; give one target per sentence")
    pairs = eager.maps(AttentionInput.of(texts, targets=targets), level="token", truncate=settings.truncate)
    return maps, pairs, norm_maps


def _syntax_stages(lm: LoadedModel, stage: _Stages, settings: RunSettings, roles, conllu, select_on, *,
                   progress: bool):
    """The syntax analysis of `conllu` (heads chosen on `select_on`) and the clusters of its heads."""
    found = stage.run("syntax", syntax, lm, conllu, select_on=select_on, n_perm=settings.permutations,
                      seed=settings.seed, batch_size=settings.batch_size, progress=progress,
                      attention=settings.attention, budget=settings.memory_budget)
    clusters = stage.run("syntax_clusters", syntax_clusters, [lm], conllu, roles=roles, seed=settings.seed,
                         batch_size=settings.batch_size)
    return found, clusters


def _model_info(lm: LoadedModel, verification: Verification | None, seconds: dict) -> dict:
    cfg = lm.config
    return {
        "source": lm.source, "architecture": getattr(cfg, "model_type", "unknown"),
        "family": getattr(verification, "family", None), "causal": lm.is_causal,
        "layers": getattr(cfg, "num_hidden_layers", None), "heads": getattr(cfg, "num_attention_heads", None),
        "kv_heads": getattr(cfg, "num_key_value_heads", None) or getattr(cfg, "num_attention_heads", None),
        "parameters": sum(p.numel() for p in lm.model.parameters()), "context": lm.max_length,
        "dtype": str(lm.dtype).replace("torch.", ""), "device": str(lm.device), **_placed(lm), "seconds": dict(seconds),
    }


def _placed(lm: LoadedModel) -> dict:
    """Where accelerate put a placed model's blocks, `{"placement": {"cpu": 3, "disk": 28}}` (blocks per device,
    GPUs by number as text); nothing for a model on one device."""
    placed = getattr(lm.model, "hf_device_map", None)
    if not placed:
        return {}
    counts: dict[str, int] = {}
    for where in placed.values():
        counts[str(where)] = counts.get(str(where), 0) + 1
    return {"placement": counts}
