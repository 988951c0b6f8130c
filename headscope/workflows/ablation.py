"""Does the head matter? Workflows that compose interventions, effects and their statistics.

    ablate(lm, heads, method=..., corpus=... | task="induction" | task=Cloze(...) | task=Choice(...))
        -> analyses.ablation.AblationResult: the effect against random head sets of the same size
    choice_check(lm, heads, Choice(...))
        -> analyses.ablation.ChoiceCheck: the per-example preferences behind flips of a decoder's
           choice between continuations (`hs.ablate_chosen_head`, `headscope coref --ablate`)
    ablate_each(lm, task=...)      every head alone (for "does looking predict mattering?")
    importance(lm, texts)          gradient head importance (Michel et al. 2019)
    ablation_evidence(lm, texts, scores, probes)
        -> analyses.evidence.AblationEvidence: every head alone, importance, the induction ablation and
           the probes' cloze checks, for the report (`headscope run`)
    ablate_chosen_head(lm, probe)  a relation probe's chosen head against random heads, on the
                                   decoder's choice between the candidates (`headscope coref --ablate`)

The effect metric follows the model and the task unless given: a decoder's next-token loss over a
corpus, the loss on the second copy of repeated random tokens for `task="induction"`, the logit
difference for a `Cloze`, the preference between options for a `Choice`; an encoder's sentence embedding (cosine to the clean one), or a chosen
word's final representation with `word=`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Sequence

import pandas as pd
import torch

from headscope.probe.progress import progress as progress_bar

from headscope.analyses.ablation import AblationResult, ChoiceCheck, random_head_sets
from headscope.analyses.evidence import AblationEvidence
from headscope.analyses.corpus import builtin_corpus
from headscope.analyses.relations import COREF_TEMPLATE, continuation
from headscope.probe.effects import (EffectTask, logit_diff, next_token_loss, option_preference, sentence_cosine,
                                     sequence_loss, word_cosine)
from headscope.probe.forward import attention_layers
from headscope.probe.images import for_input
from headscope.probe.importance import gradient_importance
from headscope.probe.interventions import (AblationMethod, ablate as ablate_heads, ablate_copies, check_heads, head_means,
                                          refuse_seq2seq)
from headscope.probe.model import LoadedModel
from headscope.probe.names import DEFAULT_ABLATION_METHOD
from headscope.probe.replay import CleanPrefix

from .heads import induction_inputs

__all__ = ["Choice", "Cloze", "InductionTask", "ablate", "heads_by_metric", "ablation_evidence", "choice_check", "ablate_each", "effect_task", "importance",
           "ablate_chosen_head", "DEFAULT_REFERENCE_TEXTS"]

DEFAULT_REFERENCE_TEXTS = 64  # built-in corpus texts behind method="mean" when no corpus is given
STACK_BYTES = 1 << 28  # about the activations of one stacked read in `ablate_each` (copies of a batch, a head each)


@dataclass(frozen=True)
class Cloze:
    """Prompts with a right and a wrong next word each (e.g. "The keys to the cabinet" · " are" / " is")."""

    prompts: tuple[str, ...]
    right: tuple[str, ...]
    wrong: tuple[str, ...]


@dataclass(frozen=True)
class Choice:
    """Prompts, each with its options (whole continuations, any number of tokens) and the right one's index."""

    prompts: tuple[str, ...]
    options: tuple[tuple[str, ...], ...]
    answers: tuple[int, ...]


@dataclass(frozen=True)
class InductionTask:
    """Repeated random tokens (Olsson et al. 2022): the loss on the second copy needs induction heads."""

    n_sequences: int = 20
    length: int = 50
    seed: int = 0


Task = Literal["induction"] | InductionTask | Cloze | Choice  # what an ablation is measured on, besides a corpus


def effect_task(lm: LoadedModel, *, corpus: Sequence[str] | None = None,
                task: Task | None = None, word: str | None = None,
                batch_size: int = 8) -> tuple[EffectTask, dict]:
    """The effect measurement for a model and a task, and the settings that describe it."""
    if (corpus is None) == (task is None):
        raise ValueError("give exactly one of corpus= (texts) or task= ('induction' or a Cloze)")
    refuse_seq2seq(lm, "head ablation")  # before the clean readout, which would fail in the model
    if task == "induction":
        task = InductionTask()
    if isinstance(task, InductionTask):
        if not lm.is_causal:
            raise ValueError(f"the induction task needs a decoder; {lm.name} is an encoder")
        seqs, prefix = induction_inputs(lm, n_sequences=task.n_sequences, length=task.length, seed=task.seed)
        start = len(prefix) + task.length  # first token of the second copy
        return (sequence_loss(lm, seqs, start=start, batch_size=batch_size,
                              description="change in loss on the second copy of repeated random tokens"),
                {"task": "induction", "sequences": task.n_sequences, "length": task.length, "seed": task.seed,
                 "prefix": list(prefix)})
    if isinstance(task, Cloze):
        return logit_diff(lm, task.prompts, task.right, task.wrong, batch_size=batch_size), {"task": "cloze"}
    if isinstance(task, Choice):
        return (option_preference(lm, task.prompts, task.options, task.answers, batch_size=batch_size),
                {"task": "choice"})
    if task is not None:
        raise ValueError(f"task must be 'induction', an InductionTask, a Cloze or a Choice, got {task!r}")
    texts = list(corpus)
    if word is not None:
        return word_cosine(lm, texts, word, batch_size=batch_size), {"task": "corpus", "word": word}
    if lm.is_causal:
        return next_token_loss(lm, texts, batch_size=batch_size), {"task": "corpus"}
    return sentence_cosine(lm, texts, batch_size=batch_size), {"task": "corpus"}


def _means(lm: LoadedModel, method: str, corpus, reference, batch_size: int) -> torch.Tensor | None:
    if method != "mean":
        return None
    if reference is None:
        reference = list(corpus) if corpus is not None else builtin_corpus()[:DEFAULT_REFERENCE_TEXTS]
    return head_means(lm, reference, batch_size=batch_size)


HEADS_BY_TEXTS = 32  # built-in corpus texts that `heads_by_metric` scores when no corpus is given


def parse_heads_by(spec: str) -> tuple[str, int]:
    """`"METRIC:K"` as (metric, k): a metric of `hs.heads` and a count from 1; a `ValueError` naming `spec` else.

    >>> parse_heads_by("induction:5")
    ('induction', 5)
    """
    from headscope.analyses.metrics import METRICS

    metric, sep, k = str(spec).partition(":")
    if not sep or not k.strip().isdigit() or int(k) < 1:
        raise ValueError(f"{spec!r}: write METRIC:K, e.g. induction:5")
    if metric not in METRICS:
        raise ValueError(f"{spec!r}: unknown metric {metric!r}; choose one of {', '.join(METRICS)}")
    return metric, int(k)


def heads_by_metric(lm: LoadedModel, spec: str, texts: Sequence[str] | None = None, *,
             progress: bool = False) -> list[tuple[int, int]]:
    """The K heads scoring highest on METRIC, `spec` = "METRIC:K" (a metric of `hs.heads`, e.g. "induction:5"),
    scored as `hs.heads` scores them over `texts` (default: the first 32 built-in corpus texts). A `ValueError`
    for a spec that is not METRIC:K, an unknown metric, or one this model has no score for."""
    from .heads import heads as score_heads

    try:
        metric, k = parse_heads_by(spec)
    except ValueError as exc:
        raise ValueError(f"heads_by {exc}") from None
    refuse_seq2seq(lm, "head ablation")  # before every head is scored
    texts = list(texts) if texts is not None else builtin_corpus()[:HEADS_BY_TEXTS]
    top = score_heads(lm, texts, progress=progress, total=len(texts)).top(metric, k)
    if top.empty:
        raise ValueError(f"heads_by {spec}: {lm.name} has no {metric} score (not applicable to this model)")
    return [(int(r.layer), int(r.head)) for r in top.itertuples()]


def ablate(lm: LoadedModel, heads: Sequence[tuple[int, int]] | None = None, *, heads_by: str | None = None,
           method: AblationMethod = DEFAULT_ABLATION_METHOD, corpus: Sequence[str] | None = None,
           task: Task | None = None, word: str | None = None, reference: Sequence[str] | None = None,
           n_random: int = 19, seed: int = 0, batch_size: int = 8, progress: bool = False) -> AblationResult:
    """Ablate `heads` (or the heads `heads_by` chooses, "METRIC:K": the K top heads of a `hs.heads` metric over
    the corpus, see `heads_by_metric`), then `n_random` random sets of as many other heads, and compare the effects.

    `method` is how a head is switched off: by default its mean output (`DEFAULT_ABLATION_METHOD`, as the CLI's
    `--method`) over the `reference` texts (default: the corpus, or the first 64 texts of the built-in corpus for
    a task). With 19 random sets the smallest p is 0.05.
    `progress`: a bar on stderr, one step per pass (the clean one, the heads', each random set's).

    >>> from headscope.probe.tiny import tiny_model
    >>> r = ablate(tiny_model("gpt2"), [(1, 0)], corpus=["The cat sat on the mat."], n_random=3)
    >>> r.to_dict()["random"]["n"], r.effect_metric
    (3, 'next_token_loss')
    """
    lm = for_input(lm, images=False)  # a two-tower model's text tower; an image model: one line
    if (heads is None) == (heads_by is None):
        raise TypeError("give exactly one of heads=[(layer, head), ...] or heads_by='METRIC:K'")
    if heads_by is not None:
        heads = heads_by_metric(lm, heads_by, corpus, progress=progress)
    heads = _checked(lm, heads, n_random)
    measure, settings = effect_task(lm, corpus=corpus, task=task, word=word, batch_size=batch_size)
    means = _means(lm, method, corpus, reference, batch_size)
    clean, ablated, _, random_readouts = _readouts(lm, heads, measure, method=method, means=means, n_random=n_random,
                                                   seed=seed, progress=progress)
    effect = measure.change(clean, ablated)
    random_effects = tuple(measure.change(clean, r) for r in random_readouts)
    baseline = float(clean.double().mean()) if clean.dim() == 1 else 1.0
    return AblationResult(model=lm.name, heads=heads, method=method, effect_metric=measure.metric, effect=effect,
                          random_effects=random_effects, stronger=measure.stronger, baseline=baseline, n=measure.n,
                          description=measure.description, extra=settings | {"random_seed": seed})


def choice_check(lm: LoadedModel, heads: Sequence[tuple[int, int]], choice: Choice, *,
                 method: AblationMethod = DEFAULT_ABLATION_METHOD, reference: Sequence[str] | None = None,
                 n_random: int = 19, seed: int = 0, batch_size: int = 8, progress: bool = False) -> ChoiceCheck:
    """Ablate `heads`, then `n_random` random sets of as many other heads, and keep every example's preference.

    The random sets are `ablate`'s for the same seed; with 19 of them the smallest p is 0.05.
    """
    heads = _checked(lm, heads, n_random)
    measure, _ = effect_task(lm, task=choice, batch_size=batch_size)
    means = _means(lm, method, None, reference, batch_size)
    clean, ablated, _, random_readouts = _readouts(lm, heads, measure, method=method, means=means, n_random=n_random,
                                                   seed=seed, progress=progress)

    def values(t: torch.Tensor) -> tuple[float, ...]:
        return tuple(float(v) for v in t)

    return ChoiceCheck(model=lm.name, heads=heads, method=method, before=values(clean), after=values(ablated),
                       random_after=tuple(values(r) for r in random_readouts))


def _checked(lm: LoadedModel, heads, n_random: int) -> tuple[tuple[int, int], ...]:
    heads = check_heads(lm, heads)
    if not heads:
        raise ValueError("no heads to ablate")
    if n_random < 0:
        raise ValueError("n_random must be 0 or more")
    return heads


def _readouts(lm: LoadedModel, heads, measure: EffectTask, *, method: AblationMethod, means, n_random: int, seed: int,
              progress: bool = False):
    """(clean readout, readout with `heads` ablated, the random sets, their readouts); `progress`: a bar, one step
    per pass."""
    sets = random_head_sets(attention_layers(lm), lm.config.num_attention_heads, heads, len(heads), n_random,
                            seed=seed)
    prefix = CleanPrefix(lm)  # layers below an ablated set's first are the clean pass's: replayed, not rerun
    with progress_bar(total=2 + len(sets), desc=f"{lm.name} ablation", unit="pass", enabled=progress) as bar:
        with prefix.recording():
            clean = measure.read(lm)
        bar.update()

        def read_with(chosen) -> torch.Tensor:
            with ablate_heads(lm, chosen, method=method, means=means):
                out = prefix.read(lambda: measure.read(lm), min(l for l, _ in chosen))
            bar.update()
            return out

        ablated = read_with(heads)
        return clean, ablated, sets, tuple(read_with(s) for s in sets)


def ablate_each(lm: LoadedModel, *, method: AblationMethod = DEFAULT_ABLATION_METHOD,
                corpus: Sequence[str] | None = None, task: Task | None = None, word: str | None = None,
                reference: Sequence[str] | None = None, batch_size: int = 8, progress: bool = False):
    """The effect of ablating every head alone: a tidy frame `(model, layer, head, effect_metric, effect)`.

    The heads of one layer are read together where the task can (`EffectTask.stacked`): each batch runs as
    stacked copies, one head ablated in each (`probe.interventions.ablate_copies`), as many copies as fit in
    `STACK_BYTES`; the first such read is checked against the head's own pass, and reads go head by head
    from then on if it differs. Below the ablated layer the clean pass's layers are replayed, not rerun."""
    lm = for_input(lm, images=False)  # a two-tower model's text tower; an image model: one line
    measure, _ = effect_task(lm, corpus=corpus, task=task, word=word, batch_size=batch_size)
    means = _means(lm, method, corpus, reference, batch_size)
    prefix = CleanPrefix(lm)  # the layers below each ablated head are the clean pass's: replayed, not rerun
    with prefix.recording():
        clean = measure.read(lm)
    n_heads = lm.config.num_attention_heads
    heads = [(l, h) for l in range(lm.config.num_hidden_layers) for h in range(n_heads)]
    bar = progress_bar(total=len(heads), desc=f"{lm.name} single-head ablations", unit="head", enabled=progress)
    width = max(1, min(n_heads, STACK_BYTES // max(measure.copy_bytes, 1))) if measure.stacked is not None else 1
    readouts: dict[tuple[int, int], torch.Tensor] = {}
    checked = False
    layers = list(range(lm.config.num_hidden_layers))
    layers = layers[1:2] + layers[:1] + layers[2:]  # the check below on a replayed layer: the replay's own is one head's
    for layer in layers:
        for start in range(0, n_heads, width):
            group = list(range(start, min(start + width, n_heads)))
            if len(group) > 1 and width > 1:
                if not checked:  # the first stacked read is checked against its first head's own pass
                    with ablate_heads(lm, [(layer, group[0])], method=method, means=means):
                        alone = prefix.read(lambda: measure.read(lm), layer)
                with ablate_copies(lm, layer, group, method=method, means=means):
                    stacked = prefix.read(lambda: measure.stacked(lm, len(group)), layer, copies=len(group))
                if not checked:
                    checked = True
                    if not torch.allclose(stacked[0], alone, rtol=1e-6, atol=1e-6):
                        width, stacked = 1, alone[None]  # rows of a batch do not stay apart: head by head from now on
                readouts.update({(layer, h): r for h, r in zip(group, stacked)})
                bar.update(len(stacked))
            for h in group:
                if (layer, h) not in readouts:
                    with ablate_heads(lm, [(layer, h)], method=method, means=means):
                        readouts[(layer, h)] = prefix.read(lambda: measure.read(lm), layer)
                    bar.update(1)
    bar.close()
    return pd.DataFrame([{"model": lm.name, "layer": l, "head": h, "effect_metric": measure.metric,
                          "effect": measure.change(clean, readouts[(l, h)])} for l, h in heads])


def importance(lm: LoadedModel, texts: Sequence[str], *, batch_size: int = 8, truncate: bool = False,
               progress: bool = False):
    """Gradient head importance (`probe.importance.gradient_importance`); `.to_frame()` gives tidy rows;
    `progress`: a bar on stderr."""
    return gradient_importance(lm, texts, batch_size=batch_size, truncate=truncate, progress=progress)


def ablation_evidence(lm: LoadedModel, texts: Sequence[str], scores=None, probes: Sequence = (), *,
                    method: AblationMethod = DEFAULT_ABLATION_METHOD, n_random: int = 19, induction_k: int = 5,
                    induction: InductionTask = InductionTask(n_sequences=5, length=25), cloze_examples: int = 40,
                    seed: int = 0, batch_size: int = 8, progress: bool = False):
    """Every head ablated alone on `texts`, gradient importance over them, for a decoder the top
    `induction_k` induction heads of `scores` (at most half the heads) against random sets, and each probe's cloze check
    (its chosen head, the first `cloze_examples` examples) -> `analyses.evidence.AblationEvidence`."""
    texts = list(texts)
    measure, _ = effect_task(lm, corpus=texts, batch_size=batch_size)
    frame = ablate_each(lm, method=method, corpus=texts, batch_size=batch_size, progress=progress)
    single = torch.tensor(frame["effect"].to_numpy(), dtype=torch.float64).view(
        lm.config.num_hidden_layers, lm.config.num_attention_heads)
    imp = importance(lm, texts, batch_size=batch_size)
    top = None
    if lm.is_causal and scores is not None and "induction" in scores.metrics and induction_k > 0:
        total = lm.config.num_hidden_layers * lm.config.num_attention_heads
        t = scores.top("induction", k=min(induction_k, total // 2))  # random sets need heads outside the top
        top = ablate(lm, [(int(r.layer), int(r.head)) for r in t.itertuples()], method=method, task=induction,
                     n_random=n_random, seed=seed, batch_size=batch_size)
    choices = {p.task: ablate_chosen_head(lm, p, method=method, n_random=n_random, seed=seed, batch_size=batch_size,
                              max_examples=cloze_examples) for p in probes}
    return AblationEvidence(model=lm.name, method=method, effect_metric=measure.metric, description=measure.description,
                          stronger=measure.stronger, n_texts=measure.n, single=single, importance=imp.importance,
                          importance_loss=imp.loss, induction=top, choices=choices, n_random=n_random, seed=seed)


def ablate_chosen_head(lm: LoadedModel, result, *, template: str | None = None,
                       method: AblationMethod = DEFAULT_ABLATION_METHOD, n_random: int = 19, seed: int = 0,
                       batch_size: int = 8, max_examples: int | None = None) -> dict:
    """Ablate a relation probe's chosen head (`result`, an `analyses.coref.ProbeResult`) and compare the
    model's preference between the candidates with random head sets (decoders), on the examples the
    head was chosen on -> a dict.

    `template` is the continuation prompt (default: `analyses.relations.COREF_TEMPLATE`); `method`
    one of `probe.interventions.ABLATION_METHODS`; `max_examples` keeps the first examples only.
    The dict is `analyses.ablation.ChoiceCheck.to_dict()` (delta of the preference, flips) with the
    template and task, or `{"skipped": why}`.
    """
    template = template or COREF_TEMPLATE
    if result.best_head is None:
        return {"skipped": "no head was selected, so there is nothing to ablate"}
    if not lm.is_causal:
        return {"skipped": f"{lm.name} is an encoder: it does not predict a continuation to compare"}
    examples = result.data.examples[:max_examples]
    prompts, options = zip(*(continuation(ex, template=template) for ex in examples))
    choice = Choice(tuple(prompts), tuple(tuple(o) for o in options), tuple(ex.answer for ex in examples))
    check = choice_check(lm, [result.best_head], choice, method=method, n_random=n_random, seed=seed,
                         batch_size=batch_size)
    return {**check.to_dict(), "prompt_template": template, "task": result.task}
