"""What a head writes and why it attends there: the decompositions and patching, composed for one question each.

    dla(lm, prompt, answer, wrong=None)      -> probe.results.DLAResult: the next-token logit
                                                (difference) split into embeddings, heads, MLPs, biases
    qk(lm, text, layer=, head=, query=, key=) -> probe.results.QKAttribution: one head's score for
                                                one query and key split over (query part, key part) pairs
    composition(lm)                          -> probe.results.CompositionScores: Q-, K-, V-composition
                                                between every pair of heads, against random matrices
    patch(lm, pairs, what=..., direction=...) -> analyses.patching.PatchResult: activation patching of
                                                every head (or layer) on clean/corrupt pairs, with its
                                                statistics
    mechanisms(lm, sentences)                -> analyses.mechanisms.MechanismsReport: the report's section,
                                                DLA of each sentence's next token, composition, patching
                                                of a built-in pair set

Each decomposition is an identity that sums back to the model's own number; each result carries the
error of that identity.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Literal, Sequence, get_args

import numpy as np

from headscope.analyses.ablation import random_head_sets
from headscope.analyses.mechanisms import COMPOSITION_EDGES, MechanismsReport
from headscope.analyses.patching import (AttributionPatching, Confirmation, PatchPair, PatchResult, builtin_pairs,
                                         read_pairs, split_halves, strength, top_sites)
from headscope.probe.attribution import answer_token, direct_logit_attribution, qk_attribution, require_lm_head
from headscope.probe.composition import composition_scores
from headscope.probe.forward import attention_layers
from headscope.probe.model import LoadedModel
from headscope.probe.names import PatchDirection, PatchPositions, PatchWhat
from headscope.probe.results import CompositionScores, DLAResult, QKAttribution
from headscope.probe.progress import progress as progress_bar
from headscope.probe.patching import (attribution_estimates, patch_metrics, path_patch_metrics, prepare_pairs,
                                     sweep_sites)
from headscope.probe.types import head_name, parse_head, seed_value, whole_number

__all__ = ["dla", "qk", "composition", "patch", "patch_pairs", "attribution_patch", "mechanisms", "REPORT_PAIRS"]

REPORT_PAIRS = 8  # pairs of the built-in set the report patches: enough for the held-out check (4 + 4)


def dla(lm: LoadedModel, prompt: str, answer: str | int | None, wrong: str | int | None = None, *,
        progress: bool = False) -> DLAResult:
    """Direct logit attribution (decoders): the logit of `answer` (None: the model's own most likely next
    token) after `prompt`, minus that of `wrong` if given, split into the residual stream's parts with the final norm's scale frozen at this run's
    value (`probe.attribution.direct_logit_attribution`). `.summary()` states the identity's error. `progress`: a bar
    on stderr, one step per layer of the traced forward pass.

    >>> from headscope.probe.tiny import tiny_model
    >>> r = dla(tiny_model("gpt2"), "The cat sat on the", " mat")
    >>> r.identity_abs_err < 1e-5, r.grid().shape
    (True, (2, 4))
    """
    return direct_logit_attribution(lm, prompt, answer, wrong, progress=progress)


def qk(lm: LoadedModel, text: str, *, layer: int, head: int, query: int | str, key: int | str,
       occurrence: int = 0, progress: bool = False) -> QKAttribution:
    """QK attribution: head `layer`.`head`'s pre-softmax score from `query` to `key` in `text` split
    over (query-side part, key-side part) pairs of the residual stream, with the norms' scales frozen
    and rotary applied to each part; the terms sum to the verified from-scratch score
    (`probe.attribution.qk_attribution`). `weight_without` gives the key's softmax weight with one
    part removed from one side. `progress`: a bar on stderr, one step per layer of the traced forward pass.

    >>> from headscope.probe.tiny import tiny_model
    >>> r = qk(tiny_model("gemma3"), "The cat sat on the mat.", layer=2, head=1, query=5, key=2)
    >>> r.identity_abs_err < 1e-5, r.terms.shape[0] == r.terms.shape[1]
    (True, True)
    """
    return qk_attribution(lm, text, layer=layer, head=head, query=query, key=key, occurrence=occurrence,
                          progress=progress)


def composition(lm: LoadedModel, *, n_random: int = 20, seed: int = 0, layers: int | None = None,
                progress: bool = False) -> CompositionScores:
    """Q-, K- and V-composition scores (Elhage et al. 2021) between every earlier and later head, from the
    weights alone (the pre-attention norm weight folded in), with the mean score of random matrices of
    the same shapes as the baseline (`probe.composition.composition_scores`); `layers`: only the first
    that many layers. `progress`: a bar on stderr, one step per pair of layers."""
    return composition_scores(lm, n_random=n_random, seed=seed, layers=layers, progress=progress)


def patch_pairs(lm: LoadedModel, pairs: str | Sequence[PatchPair]) -> tuple[list[PatchPair], int]:
    """The pairs to patch and how many were left out: a built-in set's name ("ioi", "agreement"), whose
    pairs with a clean and a corrupt prompt of different token lengths for this tokenizer are left
    out; a JSONL path; or PatchPairs (which must all match in length)."""
    require_lm_head(lm, "activation patching")  # before the tokenizer: an image model has none
    if isinstance(pairs, str):
        if pairs in ("ioi", "agreement"):
            every = builtin_pairs(pairs)
            tok = lm.tokenizer
            # a pair whose right and wrong answers start with the same token measures 0 in every run: left out too
            kept = [p for p in every if len(tok(p.clean)["input_ids"]) == len(tok(p.corrupt)["input_ids"])
                    and answer_token(lm, p.right) != answer_token(lm, p.wrong)]
            if not kept:
                raise ValueError(f"no pair of the built-in set {pairs!r} keeps its length and two different answer "
                                 f"tokens under {lm.name}'s tokenizer")
            return kept, len(every) - len(kept)
        return read_pairs(pairs), 0
    if isinstance(pairs, (set, frozenset)) or not isinstance(pairs, Sequence):
        raise TypeError(f"pairs must be a built-in set's name, a JSONL path or a list of PatchPair, got "
                        f"{type(pairs).__name__}")
    bad = next((i for i, x in enumerate(pairs) if not isinstance(x, PatchPair)), None)
    if bad is not None:
        raise TypeError(f"pair {bad} is a {type(pairs[bad]).__name__}, not a PatchPair(clean, corrupt, right, wrong)")
    return list(pairs), 0


def patch(lm: LoadedModel, pairs: str | Sequence[PatchPair], *, what: PatchWhat = "head_out",
          direction: PatchDirection = "denoise", positions: PatchPositions = "all", k: int = 3,
          n_random: int = 19, seed: int = 0, batch_rows: int = 512, sender: str | tuple[int, int] | None = None,
          receivers: Literal["q", "k", "v"] = "q", freeze_mlps: bool = False, progress: bool = False) -> PatchResult:
    """Activation patching of every site of one kind on clean/corrupt pairs, in one `direction`.

    `what`: each head's output ("head_out"), its attention pattern, its queries, keys or values
    ("pattern", "q", "k", "v": the head's output recomputed from the source's pattern, q, k or v and
    the run's others), each MLP, the residual stream entering each layer ("resid"), or "path": path
    patching (Wang et al. 2022) from the `sender` head ("L9H6" or (9, 6)) to the `receivers` input
    (q, k or v) of each head of every later layer, every other head frozen (`freeze_mlps`: the MLPs
    too; `probe.patching.path_patch_metrics`).

    `pairs`: a built-in set ("ioi", "agreement"), a JSONL file of {"clean", "corrupt", "right", "wrong"},
    or a list of `PatchPair`. `positions="each"` patches the residual stream at each position alone
    (all pairs must then have the same length). Every patch of a group of sites runs in one batched
    forward pass over all pairs (`probe.patching.patch_metrics`).

    For head outputs with at least 4 pairs the result also holds an honest check
    (`analyses.patching.Confirmation`): the `k` heads that move the metric most on a random half of
    the pairs, patched together on the other half, against `n_random` random sets of `k` heads.
    `progress`: a bar on stderr, one step per forward pass (each stage adds its passes as it starts).

    >>> from headscope.probe.tiny import tiny_model
    >>> from headscope.analyses.patching import PatchPair
    >>> r = patch(tiny_model("llama"), [PatchPair("The cat sat on the", "The dog sat on the", " mat", " dog")])
    >>> r.values.shape   # [head, pair]
    (8, 1)
    """
    if what not in get_args(PatchWhat):
        raise ValueError(f"what must be one of {', '.join(get_args(PatchWhat))}, got {what!r}")
    if (what == "path") != (sender is not None):
        raise ValueError("path patching needs a sender head (sender='L9H6'), and only path patching takes one")
    if what == "path" and receivers not in ("q", "k", "v"):
        raise ValueError(f"receivers must be q, k or v, got {receivers!r}")
    if isinstance(sender, str):
        sender = parse_head(sender)
    elif sender is not None:
        sender = tuple(whole_number(x, "sender's layer and head", minimum=None) for x in sender)
    k, n_random = whole_number(k, "k"), whole_number(n_random, "n_random")
    seed, batch_rows = seed_value(seed), whole_number(batch_rows, "batch_rows", minimum=1)
    if positions not in ("all", "each"):
        raise ValueError(f"positions must be 'all' or 'each', got {positions!r}")
    if positions == "each" and what != "resid":
        raise ValueError("positions='each' patches the residual stream per position; use it with what='resid'")
    chosen, dropped = patch_pairs(lm, pairs)
    if positions == "each" and isinstance(pairs, str) and pairs in ("ioi", "agreement"):
        # a built-in set mixes lengths; per-position patching keeps the most common one
        lengths = [len(lm.tokenizer(x.clean)["input_ids"]) for x in chosen]
        common = max(set(lengths), key=lambda n: (lengths.count(n), -n))
        dropped += sum(n != common for n in lengths)
        chosen = [x for x, n in zip(chosen, lengths) if n == common]
    p = _prepared(lm, chosen)
    n_heads = lm.config.num_hidden_layers * lm.config.num_attention_heads
    if what == "head_out" and p.n >= 4 and n_random and k > n_heads // 2:  # was "cannot draw 7 random heads from the 1 ..."
        raise ValueError(f"k = {k} (CLI: --top): the held-out check compares the k strongest heads with random sets "
                         f"of k other heads, so {lm.name}'s {n_heads} heads allow at most {n_heads // 2}")
    n_positions = None
    if positions == "each":
        if len(set(p.lengths)) != 1:
            raise ValueError("per-position patching needs every pair to have the same number of tokens; "
                             f"these have {sorted(set(p.lengths))}")
        n_positions = p.lengths[0]
    start = time.perf_counter()
    with progress_bar(desc=f"{lm.name} patch {what}", unit="forward", enabled=progress) as bar:
        result = _patch_all(lm, p, chosen, dropped, what=what, direction=direction, k=k, n_random=n_random, seed=seed,
                            batch_rows=batch_rows, sender=sender, receivers=receivers, freeze_mlps=freeze_mlps,
                            n_positions=n_positions, bar=bar)
    return replace(result, seconds=time.perf_counter() - start)


def _patch_all(lm, p, chosen, dropped, *, what, direction, k, n_random, seed, batch_rows, sender, receivers,
               freeze_mlps, n_positions, bar) -> PatchResult:
    """`patch`'s forward passes, each a step of `bar`."""
    clean = patch_metrics(lm, p, [frozenset()], direction="noise", bar=bar)[0].numpy()
    corrupt = patch_metrics(lm, p, [frozenset()], direction="denoise", bar=bar)[0].numpy()
    if what == "path":
        n_layers, nh = lm.config.num_hidden_layers, lm.config.num_attention_heads
        if not (0 <= sender[0] < n_layers - 1 and 0 <= sender[1] < nh):
            raise ValueError(f"sender {head_name(*sender)}: path patching needs a head before the last layer of "
                             f"{lm.name} ({n_layers} layers × {nh} heads)")
        sites = [(receivers, l, h) for l in range(sender[0] + 1, n_layers) for h in range(nh)]
        values = path_patch_metrics(lm, p, sender, [frozenset([s]) for s in sites], direction=direction,
                                    freeze_mlps=freeze_mlps, batch_rows=batch_rows, bar=bar).numpy()
        forwards = 2 + 3 + -(-len(sites) // max(1, batch_rows // p.n))  # clean, corrupt, base + source + frozen run
    else:
        sites = sweep_sites(lm, what, n_positions=n_positions)
        values = patch_metrics(lm, p, [frozenset([s]) for s in sites], direction=direction,
                               batch_rows=batch_rows, bar=bar).numpy()
        forwards = 2 + 1 + -(-len(sites) // max(1, batch_rows // p.n))  # clean, corrupt, the source run, the patches
    confirmation = None
    if what == "head_out" and p.n >= 4 and k > 0:
        confirmation = _confirm(lm, p, sites, values, clean, corrupt, direction=direction, k=k, n_random=n_random,
                                seed=seed, batch_rows=batch_rows, bar=bar)
        forwards += 1 + -(-(1 + n_random) // max(1, batch_rows // len(confirmation.heldout)))  # source + patches
    return PatchResult(model=lm.name, what=what, direction=direction, sites=tuple(sites), values=values, clean=clean,
                       corrupt=corrupt, pairs=tuple(chosen), confirmation=confirmation, dropped=dropped,
                       seconds=0.0, forwards=forwards, sender=sender)


def _prepared(lm: LoadedModel, chosen: Sequence[PatchPair]):
    """The pairs tokenised (`probe.patching.prepare_pairs`), refusing those that can only give 0 / 0: a corrupt
    prompt of the same tokens as the clean one, or right and wrong answers that start with the same token (the
    metric is then 0 in every run, and the normalised values nan)."""
    p = prepare_pairs(lm, [x.clean for x in chosen], [x.corrupt for x in chosen], [x.right for x in chosen],
                      [x.wrong for x in chosen])
    for i, x in enumerate(chosen):
        if bool((p.clean[i] == p.corrupt[i]).all()):
            raise ValueError(f"pair {i}: the clean and the corrupt prompt are the same tokens ({x.clean!r}); "
                             "patching needs a corrupt prompt that differs")
        if int(p.right[i]) == int(p.wrong[i]):
            raise ValueError(f"pair {i}: right {x.right!r} and wrong {x.wrong!r} are the same token "
                             f"({lm.tokenizer.decode([int(p.right[i])])!r}); only their first tokens are compared")
    return p


def _confirm(lm, p, sites, values, clean, corrupt, *, direction, k, n_random, seed, batch_rows, bar=None) -> Confirmation:
    """Choose the k strongest heads on one half of the pairs; patch them together on the other half,
    and as many random heads `n_random` times."""
    sel, held = split_halves(p.n, seed=seed)
    score = strength(values[:, sel], clean[sel], corrupt[sel], direction).mean(-1)  # [site]
    k = min(k, len(sites) - 1)
    heads = tuple(sorted((sites[i][1], sites[i][2]) for i in top_sites(score, k)))
    sets = random_head_sets(attention_layers(lm), lm.config.num_attention_heads, heads, k, n_random, seed=seed)
    jobs = [frozenset(("head", l, h) for l, h in s) for s in (heads, *sets)]
    sub = p.subset(held.tolist())
    v = patch_metrics(lm, sub, jobs, direction=direction, batch_rows=batch_rows, bar=bar).numpy()  # [job, held-out pair]
    moved = strength(v, clean[held], corrupt[held], direction)  # [job, pair]
    sign = 1.0 if float(np.mean(clean - corrupt)) >= 0 else -1.0
    gap = sign * (clean[held] - corrupt[held])
    g = float(gap.mean())
    fractions = moved[1:].mean(-1) / g if g else np.full(len(sets), np.nan)
    return Confirmation(heads=heads, direction=direction, selection=tuple(int(i) for i in sel),
                        heldout=tuple(int(i) for i in held), per_pair=moved[0], gap=gap, random_sets=tuple(sets),
                        random_fractions=np.asarray(fractions), n_heads=len(sites))


def attribution_patch(lm: LoadedModel, pairs: str | Sequence[PatchPair], *, what: Literal["head_out", "resid"] = "head_out",
                      direction: PatchDirection = "denoise", compare: bool = True,
                      batch_rows: int = 512, progress: bool = False) -> AttributionPatching:
    """Attribution patching: every head's output (or the residual stream entering each layer) patched
    to first order — (source − base) · gradient of the metric at the base run — from one forward
    pass of the source run and one forward + backward pass of the base run
    (`probe.patching.attribution_estimates`). With `compare` (the default) real patching runs on the
    same pairs too and `.spearman` is the rank correlation of the two over sites. `progress`: a bar on stderr, one
    step per forward pass of the patches.

    >>> from headscope.probe.tiny import tiny_model
    >>> from headscope.analyses.patching import PatchPair
    >>> r = attribution_patch(tiny_model("llama"), [PatchPair("The cat sat on the", "The dog sat on the", " mat", " dog")])
    >>> r.estimate.values.shape, -1 <= r.spearman <= 1
    ((8, 1), True)
    """
    if what not in ("head_out", "resid"):
        raise ValueError(f"attribution patching covers what='head_out' and what='resid', not what={what!r}")
    batch_rows = whole_number(batch_rows, "batch_rows", minimum=1)
    chosen, dropped = patch_pairs(lm, pairs)
    p = _prepared(lm, chosen)
    with progress_bar(desc=f"{lm.name} attribution patching", unit="forward", enabled=progress) as bar:
        return _attribution_patch(lm, p, chosen, dropped, what=what, direction=direction, compare=compare,
                                  batch_rows=batch_rows, bar=bar)


def _attribution_patch(lm, p, chosen, dropped, *, what, direction, compare, batch_rows, bar) -> AttributionPatching:
    clean = patch_metrics(lm, p, [frozenset()], direction="noise", bar=bar)[0].numpy()
    corrupt = patch_metrics(lm, p, [frozenset()], direction="denoise", bar=bar)[0].numpy()
    start = time.perf_counter()
    sites, values = attribution_estimates(lm, p, what, direction=direction)
    estimate = PatchResult(model=lm.name, what=what, direction=direction, sites=tuple(sites), values=values.numpy(),
                           clean=clean, corrupt=corrupt, pairs=tuple(chosen), dropped=dropped,
                           seconds=time.perf_counter() - start, forwards=2)
    real = None
    if compare:
        start = time.perf_counter()
        v = patch_metrics(lm, p, [frozenset([s]) for s in sites], direction=direction, batch_rows=batch_rows,
                          bar=bar).numpy()
        real = PatchResult(model=lm.name, what=what, direction=direction, sites=tuple(sites), values=v, clean=clean,
                           corrupt=corrupt, pairs=tuple(chosen), dropped=dropped, seconds=time.perf_counter() - start,
                           forwards=1 + -(-len(sites) // max(1, batch_rows // p.n)))
    return AttributionPatching(estimate=estimate, real=real)


def mechanisms(lm: LoadedModel, sentences: Sequence[str], *, pair_set: str = "ioi", n_pairs: int = REPORT_PAIRS,
               edges: int = COMPOSITION_EDGES, seed: int = 0) -> MechanismsReport:
    """The report's Mechanisms section (`headscope run --mechanisms`): DLA of each sentence's next token
    (the model's own most likely one), the composition scores of every pair of heads (the tables keep
    the `edges` strongest of each kind), and head-output patching (denoising) of the first `n_pairs`
    pairs of the built-in `pair_set` that keep their length, with its held-out check. DLA and patching
    need a decoder's LM head: on other models each is one note saying why it did not run.

    >>> from headscope.probe.tiny import tiny_model
    >>> r = mechanisms(tiny_model("llama"), ["The cat sat on the"], n_pairs=4)
    >>> len(r.dla), r.composition is not None, r.patching.values.shape
    (1, True, (8, 4))
    """
    seconds: dict[str, float] = {}
    notes: list[str] = []
    t0 = time.perf_counter()
    results: list[DLAResult] = []
    try:
        results = [dla(lm, text, None) for text in sentences]
    except ValueError as exc:  # no LM head (an encoder) or an encoder–decoder model: one line says why
        notes.append(f"direct logit attribution was not run: {exc}")
    seconds["dla"] = round(time.perf_counter() - t0, 3)
    t0 = time.perf_counter()
    scores = None
    try:
        scores = composition(lm, seed=seed)
    except ValueError as exc:
        notes.append(f"composition scores were not run: {exc}")
    seconds["composition"] = round(time.perf_counter() - t0, 3)
    t0 = time.perf_counter()
    patched = None
    if results:  # patching reads the same LM head as DLA
        chosen, _ = patch_pairs(lm, pair_set)
        patched = patch(lm, chosen[:n_pairs], seed=seed)
    else:
        notes.append(f"patching of the {pair_set!r} pairs was not run: it compares next-token logits, and "
                     f"{lm.name} has no language-model head")
    seconds["patching"] = round(time.perf_counter() - t0, 3)
    return MechanismsReport(model=lm.name, dla=tuple(results), composition=scores, patching=patched,
                            pair_set=pair_set if patched is not None else None, edges=edges, notes=tuple(notes),
                            seconds=seconds)
