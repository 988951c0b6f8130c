"""Heads for long context: which heads retrieve a needle from far back, whether they matter, and a KV-cache plan.

    retrieval(lm)  -> analyses.longcontext.RetrievalResult
        needles       passkey prompts over a grid of lengths × depths, random keys in several phrasings, the
                      haystack cut from `corpus` (default: the first half of the built-in text); selection and
                      held-out halves (`make_needles`)
        scores        Wu et al. 2024's retrieval score of every head, from greedy answers to the selection
                      needles: the share of copy steps at which the head's top key is the copied token in the
                      needle (counts, Wilson 95% interval)
        check         the top `top` share of heads by that score zeroed (`probe.interventions.ablate`) against
                      `n_random` random sets of as many heads, needle accuracy on the held-out needles, a paired
                      permutation p-value and the verdict in words
        gates         optional (`gate_steps`): DuoAttention's gate optimisation (`optimise_gates`) on the selection
                      needles, each prompt followed by its key: `gate_steps` steps of Adam (`gate_lr`) on the
                      distillation of the answer's last hidden states plus `gate_l1` × the mean gate; the learned
                      gate of each KV head ranks it (steps, tokens and λ in `settings["gates"]`)
        sensitivity   optional: each KV head streamed alone (sink + recent keys), the mean KL divergence of the
                      next-token distribution from the full model's over a held-out text (the second half of
                      the built-in text, or `text`); `sensitivity_queries`: its last positions only
        plan          `fraction` of the planned KV heads full, ranked by `ranking` (the retrieval score pooled
                      per KV head as the largest of its query heads', the streaming sensitivity, both
                      combined: the mean of the two ranks, or the learned gate); the rest streaming; DuoAttention's pattern
        curve         optional (`curve`: fractions of full KV heads): the cost of the plans by each ranking at
                      each fraction, of `n_random_plans` random plans at each, all streaming and all full —
                      held-out needle accuracy, perplexity of the held-out text, KV bytes (`plan_cost`'s table)
    needle_hits(lm, ...)  -> analyses.longcontext.NeedleHits: one needle prompt (generated from the built-in
                      text, or a sentence typed), answered greedily with every head's top key per step — what the
                      explorer shows of a head's retrieval hits
    plan_cost(lm, plans, prompts, text_ids)  -> a DataFrame: per plan, held-out needle accuracy (Wilson interval),
                      perplexity of the held-out text and the KV bytes at the prompt length

`scope` says where masks apply on a needle prompt. "prompt" (the default): at every token, as Wu et al. mask
heads and DuoAttention streams them from the prefill on; one forward per needle and condition. "question":
the context (the haystack with the needle) is run once per needle by the full model and its cache shared;
heads are zeroed, or streaming heads lose all but their sink and recent keys, from the question on (the cache
compressed after the context, as RazorAttention and HeadKV do): one prefill per needle for every condition,
and plans decoded together. Perplexity follows the scope: the plan over the whole held-out text ("prompt"), or
over its last `PPL_TOKENS` tokens (at most half of it) with the text before them run once by the full model
("question").
"""

from __future__ import annotations

import math
from typing import Literal, Sequence

import numpy as np
import pandas as pd

from contextlib import nullcontext

from headscope.analyses.ablation import random_head_sets
from headscope.analyses.corpus import builtin_corpus
from headscope.analyses.longcontext import NO_COPIES, NeedleHits, RetrievalCheck, RetrievalResult, RetrievalScores, combined_rank
from headscope.analyses.stats import wilson
from headscope.probe.encoding import check_texts
from headscope.probe.interventions import ablate
from headscope.probe.kvplan import PHRASINGS, KVPlan, Phrasing, default_window, make_needles, typed_needle
from headscope.probe.longcontext import (KVLayout, NeedlePrompt, answer, answers, copy_steps, kv_layout, needle_prompt,
                                         optimise_gates, prefill, retrieval_hits, stream_heads, stream_sensitivity,
                                         token_losses)
from headscope.probe.model import LoadedModel
from headscope.probe.progress import progress as progress_bar
from headscope.probe.types import seed_value, whole_number

__all__ = ["retrieval", "needle_hits", "plan_cost", "run_section", "curve_plans", "gate_examples", "Ranking",
           "RANKINGS", "Scope", "DEFAULT_DEPTHS"]

Ranking = Literal["retrieval", "sensitivity", "combined", "gate"]
RANKINGS: tuple[str, ...] = ("retrieval", "sensitivity", "combined", "gate")
Scope = Literal["prompt", "question"]
PLAN_BATCH = 8  # plans decoded together from one shared context (scope "question")
PPL_TOKENS = 256  # scope "question": the perplexity of the held-out text's last tokens, the rest its context
DEFAULT_DEPTHS = (0.1, 0.3, 0.5, 0.7, 0.9)
CHECK_METHOD = "zero"  # the causal check zeroes the chosen heads (as its check records and the docs say)


def _halves(lm: LoadedModel, corpus: Sequence[str] | None, text: str | None) -> tuple[list[str], str]:
    """The haystack lines and the held-out text: the corpus's first half and its second half joined, unless a
    text is given (then the whole corpus is haystack)."""
    lines = check_texts(corpus) if corpus is not None else builtin_corpus()
    if text is not None:
        return lines, check_texts([text])[0]
    if len(lines) < 2:
        raise ValueError("the corpus needs at least 2 lines: the first half makes haystacks, the second half "
                         "the held-out text (or give the held-out text apart)")
    half = len(lines) // 2
    return lines[:half], " ".join(lines[half:])


def _max_new(lm: LoadedModel, prompts: Sequence[NeedlePrompt]) -> int:
    """Enough steps for the longest key as the model writes it after a space, and two more."""
    return 2 + max(len(lm.tokenizer(" " + p.key, add_special_tokens=False)["input_ids"]) for p in prompts)


def gate_examples(lm: LoadedModel, prompts: Sequence[NeedlePrompt]) -> list[tuple[tuple[int, ...], int]]:
    """DuoAttention's synthetic passkey data from needle prompts: each prompt followed by its key as the model
    writes it after a space, and where that answer starts (`optimise_gates`' examples)."""
    return [(tuple(p.ids) + tuple(lm.tokenizer(" " + p.key, add_special_tokens=False)["input_ids"]), len(p.ids))
            for p in prompts]


def _outcomes(lm: LoadedModel, prompts: Sequence[NeedlePrompt], steps: int, *, scope: Scope,
              head_sets: Sequence[tuple] = (), plans: Sequence[KVPlan] = (), bar=None) -> tuple[list, list]:
    """Needle by needle 1 (the key retrieved) or 0: per head set zeroed (an empty set: the model as it is), and
    per plan streamed; masks at every token or from the question on (`scope`, see the module)."""
    sets_out: list[list[int]] = [[] for _ in head_sets]
    plans_out: list[list[int]] = [[] for _ in plans]

    def tick(n: int = 1) -> None:
        if bar is not None:
            bar.update(n)

    if scope == "question":
        for p in prompts:
            pre = prefill(lm, p.ids[: p.context])
            for i, heads in enumerate(head_sets):
                with ablate(lm, heads, method=CHECK_METHOD) if heads else nullcontext():
                    sets_out[i].append(int(answer(lm, p.ids, max_new_tokens=steps, prefix=pre).retrieved(p.key)))
                tick()
            for j in range(0, len(plans), PLAN_BATCH):
                chunk = list(plans[j : j + PLAN_BATCH])
                with stream_heads(lm, chunk):
                    got = answers(lm, p.ids, max_new_tokens=steps, copies=len(chunk), prefix=pre)
                for k, a in enumerate(got):
                    plans_out[j + k].append(int(a.retrieved(p.key)))
                tick(len(chunk))
        return sets_out, plans_out
    for i, heads in enumerate(head_sets):
        with ablate(lm, heads, method=CHECK_METHOD) if heads else nullcontext():
            for p in prompts:
                sets_out[i].append(int(answer(lm, p.ids, max_new_tokens=steps).retrieved(p.key)))
                tick()
    for j, plan in enumerate(plans):
        with stream_heads(lm, plan):
            for p in prompts:
                plans_out[j].append(int(answer(lm, p.ids, max_new_tokens=steps).retrieved(p.key)))
                tick()
    return sets_out, plans_out


def _scope(scope: str) -> Scope:
    if scope not in ("prompt", "question"):
        raise ValueError(f"scope must be 'prompt' (masks at every token) or 'question' (from the question on), "
                         f"got {scope!r}")
    return scope  # type: ignore[return-value]


def curve_plans(layout: KVLayout, rankings: dict[str, np.ndarray], fractions: Sequence[float], n_random: int, *,
                 sink: int, recent: int, seed: int, random_fractions: Sequence[float] | None = None) -> list[KVPlan]:
    """The plans of a cost curve: each ranking at each fraction strictly between 0 and 1, `n_random` random plans
    of as many full heads at each (or at those of `random_fractions`), all streaming and all full."""
    common = dict(sink=sink, recent=recent, planned=np.array(layout.planned), own_window=layout.own_window)
    inner = sorted({float(f) for f in fractions if 0 < f < 1})
    plans = [KVPlan.all_streaming(layout.shape, **common)]
    for f in inner:
        for name, scores in rankings.items():
            plans.append(KVPlan.from_ranking(scores, f, name=f"{name} {f:.0%}", **common))
        n_full = plans[-1].n_full
        if random_fractions is not None and not any(np.isclose(f, r) for r in random_fractions):
            continue
        for d in range(n_random):
            plan = KVPlan.random(layout.shape, n_full, seed=seed + 1000 * d + n_full, **common)
            plans.append(KVPlan(plan.full, sink, recent, planned=plan.planned, own_window=plan.own_window,
                                name=f"random {f:.0%} #{d}"))
    plans.append(KVPlan.all_full(layout.shape, **common))
    return plans


def retrieval(lm: LoadedModel, *, n_needles: int = 16, n_selection: int | None = None, lengths: Sequence[int] = (1200,),
              depths: Sequence[float] = DEFAULT_DEPTHS, corpus: Sequence[str] | None = None, text: str | None = None,
              phrasings: Sequence[Phrasing] = PHRASINGS, seed: int = 0, top: float = 0.05, n_random: int = 10,
              check: bool = True, sensitivity: bool = False, sensitivity_queries: int | None = None,
              sink: int | None = None, recent: int | None = None, fraction: float = 0.5,
              ranking: Ranking = "retrieval", scope: Scope = "prompt", curve: Sequence[float] = (),
              n_random_plans: int = 10, random_fractions: Sequence[float] | None = None,
              perplexity_draws: int | None = None, gate_steps: int = 0, gate_lr: float = 0.1, gate_l1: float = 0.05,
              progress: bool = False) -> RetrievalResult:
    """Retrieval heads, the causal check, a KV plan and optionally its cost curve (see the module). `sink` /
    `recent`: a streaming head's first and last keys; `n_selection`: needles in the selection half (default half,
    the rest held out) (default `default_window` of the model's context);
    `perplexity_draws`: how many of each fraction's random plans also get the perplexity (a forward over the
    whole text each; default all); `random_fractions`: the curve's fractions that get random plans (default all);
    `gate_steps`: DuoAttention's gate optimisation on the selection needles (0: none; `gate_lr`, `gate_l1` its
    Adam step and λ, DuoAttention's 0.1 and 0.05).

    >>> from headscope.probe.tiny import tiny_model
    >>> r = retrieval(tiny_model("llama"), n_needles=2, lengths=[100], depths=[0.5], check=False,
    ...               phrasings=[Phrasing("Key {key}. Remember it. {key} is the key.", "Key:")], sink=2, recent=8)
    >>> r.scores.hits.shape, r.check, r.plan.n_full, r.plan.pattern_config()
    ((2, 4), None, 2, {'sink_size': 2, 'recent_size': 8})
    """
    n_needles = whole_number(n_needles, "n_needles", minimum=2)
    n_random = whole_number(n_random, "n_random", minimum=0)
    n_random_plans = whole_number(n_random_plans, "n_random_plans", minimum=0)
    seed = seed_value(seed)
    scope = _scope(scope)
    if not 0 < top < 1:
        raise ValueError(f"top is a share of the heads in (0, 1), got {top}")
    gate_steps = whole_number(gate_steps, "gate_steps", minimum=0)
    if ranking not in RANKINGS:
        raise ValueError(f"ranking must be one of {', '.join(map(repr, RANKINGS))}, got {ranking!r}")
    if ranking in ("sensitivity", "combined") and not sensitivity:
        raise ValueError(f"ranking={ranking!r} needs sensitivity=True (each KV head streamed alone)")
    if ranking == "gate" and not gate_steps:
        raise ValueError("ranking='gate' needs gate_steps >= 1 (DuoAttention's gate optimisation)")
    if gate_steps and not (gate_lr > 0 and gate_l1 >= 0):
        raise ValueError(f"gate_lr is > 0 and gate_l1 >= 0; got {gate_lr} and {gate_l1}")
    if any(not 0 <= f <= 1 for f in curve):
        raise ValueError(f"the curve's fractions of full KV heads are in [0, 1], got {list(curve)}")
    layout = kv_layout(lm)
    d_sink, d_recent = default_window(lm.max_length)
    sink = d_sink if sink is None else whole_number(sink, "sink", minimum=0)
    recent = d_recent if recent is None else whole_number(recent, "recent", minimum=1)
    lines, held_text = _halves(lm, corpus, text)
    needles = make_needles(n_needles, lengths=lengths, depths=depths, seed=seed, n_lines=len(lines),
                           phrasings=phrasings, n_selection=n_selection)
    prompts = [needle_prompt(lm, n, lines) for n in needles]
    selection = [p for p in prompts if p.needle.split == "selection"]
    held = [p for p in prompts if p.needle.split == "held_out"]
    steps = _max_new(lm, prompts)
    n_layers, n_heads = lm.config.num_hidden_layers, lm.config.num_attention_heads
    k = max(1, int(top * n_layers * n_heads))
    held_ids = list(lm.tokenizer(held_text)["input_ids"])[: max(lengths)]
    bar = progress_bar(total=len(selection), desc="needle answers (selection)", enabled=progress, leave=False)
    hits, copies, selection_correct = np.zeros((n_layers, n_heads), np.int64), 0, []
    for p in selection:
        ans = answer(lm, p.ids, max_new_tokens=steps, top_keys=True)
        h, c = retrieval_hits(p, ans)
        hits, copies = hits + h, copies + c
        selection_correct.append(int(ans.retrieved(p.key)))
        bar.update(1)
    bar.close()
    scores = RetrievalScores(model=lm.name, hits=hits, copies=copies, n_kv_heads=layout.n_kv_heads,
                             needles=tuple(p.needle.index for p in selection))
    if not scores.scored and (check or ranking in ("retrieval", "combined")):
        raise ValueError(f"{NO_COPIES} ({lm.name} answered {sum(selection_correct)} of {len(selection)} selection "
                         "needles); nothing to rank heads by: give more or other needles (lengths, --phrasing), a "
                         "model that answers them, or plan by streaming alone (--sensitivity --rank-by sensitivity "
                         "--no-check) or by learned gates (--gates STEPS --rank-by gate --no-check)")
    sens = None
    if sensitivity:
        if sensitivity_queries is not None:  # at most the positions whose keys the window drops
            sensitivity_queries = max(1, min(whole_number(sensitivity_queries, "sensitivity_queries", minimum=1),
                                             len(held_ids) - sink - recent))
        n_cells = sum(layout.planned) * layout.n_kv_heads
        with progress_bar(total=n_cells, desc="KV heads streamed alone", enabled=progress, leave=False) as sbar:
            sens = stream_sensitivity(lm, held_ids, sink=sink, recent=recent, queries=sensitivity_queries,
                                      progress=sbar.update)
    fit = None
    if gate_steps:
        with progress_bar(total=gate_steps, desc="gate optimisation steps", enabled=progress, leave=False) as gbar:
            fit = optimise_gates(lm, gate_examples(lm, selection), sink=sink, recent=recent, steps=gate_steps,
                                 lr=gate_lr, l1=gate_l1, seed=seed, progress=gbar.update)
    # no copy step: no retrieval ranking (only streaming alone gets here, see above)
    rankings = {"retrieval": scores.kv_score()} if scores.scored else {}
    if sens is not None:
        rankings["sensitivity"] = sens
        if scores.scored:
            rankings["combined"] = combined_rank(rankings["retrieval"], sens)
    if fit is not None:
        rankings["gate"] = fit.gates
    planned = np.array(layout.planned)
    plan = KVPlan.from_ranking(rankings[ranking], fraction, sink=sink, recent=recent, planned=planned,
                               own_window=layout.own_window, name=f"{ranking} {fraction:.0%}")
    chosen_heads = scores.top(k) if check else ()
    sets = random_head_sets(n_layers, n_heads, chosen_heads, k, n_random, seed=seed) if check else []
    head_sets = [(), chosen_heads, *sets] if check else []
    plans = curve_plans(layout, rankings, curve, n_random_plans, sink=sink, recent=recent, seed=seed,
                         random_fractions=random_fractions) if curve else []
    total = len(held) * (len(head_sets) + len(plans))
    with progress_bar(total=total, desc="needle answers (held out)", enabled=progress, leave=False) as hbar:
        set_out, plan_out = _outcomes(lm, held, steps, scope=scope, head_sets=head_sets, plans=plans, bar=hbar)
    result_check = None
    if check:
        result_check = RetrievalCheck(model=lm.name, heads=chosen_heads, clean=tuple(set_out[0]),
                                      chosen=tuple(set_out[1]), random_sets=tuple(sets),
                                      random=tuple(tuple(o) for o in set_out[2:]),
                                      extra={"method": CHECK_METHOD, "top": top, "seed": seed, "scope": scope})
    costs = None
    if plans:
        draws = n_random_plans if perplexity_draws is None else whole_number(perplexity_draws, "perplexity_draws",
                                                                               minimum=0)
        with_ppl = [not p.name.startswith("random") or int(p.name.rsplit("#", 1)[1]) < draws for p in plans]
        costs = _cost_frame(lm, layout, plans, plan_out, held_ids, with_ppl, max(p.n_tokens for p in held),
                            scope=scope, progress=progress)
        costs["scope"] = scope
    settings = {"lengths": [int(x) for x in lengths], "depths": [float(d) for d in depths], "seed": seed,
                "top": top, "k": k, "n_random": n_random, "sink": sink, "recent": recent, "fraction": fraction,
                "max_new_tokens": steps, "pooling": "a KV head's score is the largest of its query heads'",
                "held_out_text_tokens": len(held_ids), "scope": scope, "sensitivity_queries": sensitivity_queries,
                "curve": [float(f) for f in curve], "n_random_plans": n_random_plans if curve else 0,
                "gates": None if fit is None else fit.settings | {"loss_first": fit.losses[0], "loss_last": fit.losses[-1],
                                                                   "losses": list(fit.losses),
                                                                   "distill": list(fit.distill)}}
    return RetrievalResult(model=lm.name, needles=tuple(needles), selection_correct=tuple(selection_correct),
                           scores=scores, check=result_check, sensitivity=sens, plan=plan, ranking=ranking,
                           gates=None if fit is None else fit.gates,
                           n_tokens=tuple(p.n_tokens for p in prompts), settings=settings, costs=costs)


def needle_hits(lm: LoadedModel, *, statement: str | None = None, question: str | None = None, key: str | None = None,
                length: int = 256, depth: float = 0.5, seed: int = 0, max_new_tokens: int | None = None,
                corpus: Sequence[str] | None = None) -> NeedleHits:
    """One needle prompt answered greedily with every head's top-attended key at each step (`answer(top_keys=True)`)
    and Wu et al.'s copy-paste test per step (`copy_steps`). The needle is generated (`statement` None: a random
    key in one of the built-in phrasings, drawn from `seed`) or typed (`statement`, `question`, optionally the
    `key`); the haystack is cut from `corpus` (default: the first half of the built-in text, as `retrieval`'s),
    from a line drawn from `seed`. `max_new_tokens` default: the key's tokens and two more (8 without a key).

    >>> from headscope.probe.tiny import tiny_model
    >>> h = needle_hits(tiny_model("llama"), length=100, depth=0.5)
    >>> h.top_keys.shape[1:], h.span[0] < h.span[1] <= len(h.labels) <= 100
    ((2, 4), True)
    """
    if not lm.is_causal:
        raise ValueError(f"a needle prompt needs a decoder that answers it; {lm.name} is an encoder "
                         f"({lm.config.model_type}): pick a decoder (e.g. tiny:llama)")
    length = whole_number(length, "length", minimum=16)
    if isinstance(depth, bool) or not isinstance(depth, (int, float)) or not 0 <= depth <= 1:
        raise ValueError(f"depth is where the needle sits, a fraction of the haystack in [0, 1], got {depth!r}")
    seed = seed_value(seed)
    lines, _ = _halves(lm, corpus, None)
    if statement is None:
        if question is not None or key is not None:
            raise ValueError("a question or key goes with a needle sentence; give the sentence too, or neither "
                             "for a generated needle")
        needle = make_needles(2, lengths=[length], depths=[float(depth)], seed=seed, n_lines=len(lines))[0]
    else:
        needle = typed_needle(statement, question if question is not None else "", length=length, depth=float(depth),
                              key=key, offset=int(np.random.default_rng(seed).integers(len(lines))))
    if max_new_tokens is None:
        max_new_tokens = 2 + len(lm.tokenizer(" " + needle.key, add_special_tokens=False)["input_ids"]) if needle.key \
            else 8
    max_new_tokens = whole_number(max_new_tokens, "max_new_tokens", minimum=1)
    if length + max_new_tokens > lm.max_length:
        raise ValueError(f"a needle prompt of {length} tokens and {max_new_tokens} answer tokens pass {lm.name}'s "
                         f"limit of {lm.max_length}; ask for a length of at most {lm.max_length - max_new_tokens}")
    prompt = needle_prompt(lm, needle, lines)
    ans = answer(lm, prompt.ids, max_new_tokens=max_new_tokens, top_keys=True)
    copied, hit = copy_steps(prompt, ans)
    return NeedleHits(model=lm.name, needle=needle, labels=prompt.labels, span=prompt.span,
                      tokens=tuple(lm.tokenizer.decode([t]) for t in ans.ids), answer=ans.text,
                      retrieved=ans.retrieved(prompt.key) if prompt.key else None, copied=copied,
                      top_keys=ans.top_keys, hits=hit)


def _cost_frame(lm: LoadedModel, layout: KVLayout, plans: Sequence[KVPlan], outcomes: Sequence[Sequence[int]],
                text_ids: Sequence[int] | None, with_ppl: Sequence[bool], n_tokens: int, *, scope: Scope,
                progress: bool = False) -> pd.DataFrame:
    full_bytes = KVPlan.all_full(layout.shape, sink=1, recent=1, planned=np.array(layout.planned),
                                 own_window=layout.own_window).kv_bytes(n_tokens, head_dim=layout.head_dim,
                                                                        bytes_per_value=layout.bytes_per_value)
    todo = [i for i, w in enumerate(with_ppl) if w and text_ids is not None]
    ppl, dense, scored = {}, math.nan, 0
    if todo:
        pre = None
        if scope == "question":
            if len(text_ids) < 4:
                raise ValueError(f"the held-out text has {len(text_ids)} tokens; scope 'question' scores the last "
                                 "of them after a context: give a longer text")
            pre = prefill(lm, text_ids[: len(text_ids) - min(PPL_TOKENS, len(text_ids) // 2)])
        base = token_losses(lm, text_ids, prefix=pre)
        dense, scored = math.exp(float(base.mean())), len(base)
        for i in progress_bar(todo, desc="perplexity under each plan", enabled=progress, leave=False):
            ppl[i] = math.exp(float(token_losses(lm, text_ids, plans[i], prefix=pre).mean()))
    rows = []
    for i, (plan, ok) in enumerate(zip(plans, outcomes)):
        lo, hi = wilson(sum(ok), len(ok)) if ok else (math.nan, math.nan)
        b = plan.kv_bytes(n_tokens, head_dim=layout.head_dim, bytes_per_value=layout.bytes_per_value)
        kind = plan.name.split(" ")[0] if plan.name.split(" ")[0] in (*RANKINGS, "random") else plan.name
        p = ppl.get(i, math.nan)
        rows.append({"plan": plan.name, "kind": kind, "fraction_full": plan.fraction_full, "n_full": plan.n_full,
                     "needle_accuracy": sum(ok) / len(ok) if ok else math.nan, "accuracy_low": lo,
                     "accuracy_high": hi, "needles": len(ok), "perplexity": p, "perplexity_change": p / dense - 1,
                     "perplexity_tokens": scored, "kv_bytes": b, "kv_share": b / full_bytes, "sink": plan.sink,
                     "recent": plan.recent})
    return pd.DataFrame(rows)


def plan_cost(lm: LoadedModel, plans: Sequence[KVPlan], prompts: Sequence[NeedlePrompt],
              text_ids: Sequence[int] | None, *, scope: Scope = "prompt", progress: bool = False) -> pd.DataFrame:
    """What each plan costs: needle accuracy on `prompts` (Wilson 95% interval; masks per `scope`, see the
    module), perplexity of `text_ids` under the plan (NaN without a text) and the change from the full model's,
    the KV bytes after the longest prompt, and the bytes kept as a share of full."""
    if not plans or not prompts:
        raise ValueError("plan_cost needs at least one plan and one needle prompt")
    scope = _scope(scope)
    layout = kv_layout(lm)
    steps = _max_new(lm, prompts)
    with progress_bar(total=len(prompts) * len(plans), desc="needle answers", enabled=progress, leave=False) as bar:
        _, outcomes = _outcomes(lm, prompts, steps, scope=scope, plans=plans, bar=bar)
    frame = _cost_frame(lm, layout, plans, outcomes, text_ids, [True] * len(plans),
                        max(p.n_tokens for p in prompts), scope=scope, progress=progress)
    frame["scope"] = scope
    return frame


def run_section(lm: LoadedModel, *, seed: int = 0, phrasings: Sequence[Phrasing] = PHRASINGS,
                progress: bool = False) -> RetrievalResult:
    """What `headscope run --long-context` runs: 16 needles (8 selection, 8 held out) of 1,200 tokens (three
    quarters of a shorter context) at the default depths over the built-in corpus, the causal check against 10
    random head sets, each KV head streamed alone (its last 64 positions), and the cost curve at 25 / 50 / 75%
    full KV heads by each ranking, with 10 random plans at 50%; masks from the question on (scope "question")."""
    length = min(1200, (3 * lm.max_length) // 4)
    return retrieval(lm, n_needles=16, lengths=[length], seed=seed, n_random=10, sensitivity=True,
                     sensitivity_queries=64, scope="question", curve=(0.25, 0.5, 0.75), n_random_plans=10,
                     random_fractions=(0.5,), phrasings=phrasings, progress=progress)
