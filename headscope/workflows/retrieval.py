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
        sensitivity   optional: each KV head streamed alone (sink + recent keys), the mean KL divergence of the
                      next-token distribution from the full model's over a held-out text (the second half of
                      the built-in text, or `text`)
        plan          `fraction` of the planned KV heads full, ranked by `ranking` (the retrieval score pooled
                      per KV head as the largest of its query heads', or the streaming sensitivity); the rest
                      streaming; DuoAttention's pattern (`KVPlan.pattern_table` / `pattern_config`)
    plan_cost(lm, plans, prompts, text_ids)  -> a DataFrame: per plan, held-out needle accuracy (Wilson interval),
                      perplexity of the held-out text and the KV bytes at the prompt length
"""

from __future__ import annotations

import math
from typing import Literal, Sequence

import numpy as np
import pandas as pd

from headscope.analyses.ablation import random_head_sets
from headscope.analyses.corpus import builtin_corpus
from headscope.analyses.longcontext import RetrievalCheck, RetrievalResult, RetrievalScores
from headscope.probe.progress import progress as progress_bar
from headscope.probe.kvplan import PHRASINGS, KVPlan, Phrasing, default_window, make_needles
from headscope.analyses.stats import wilson
from headscope.probe.encoding import check_texts
from headscope.probe.interventions import ablate
from headscope.probe.longcontext import (NeedlePrompt, answer, kv_layout, needle_prompt, retrieval_hits,
                                         stream_heads, stream_sensitivity, token_losses)
from headscope.probe.model import LoadedModel
from headscope.probe.types import seed_value, whole_number

__all__ = ["retrieval", "plan_cost", "Ranking", "DEFAULT_DEPTHS"]

Ranking = Literal["retrieval", "sensitivity"]
DEFAULT_DEPTHS = (0.1, 0.3, 0.5, 0.7, 0.9)


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


def _correct(lm: LoadedModel, prompts: Sequence[NeedlePrompt], steps: int, bar=None) -> tuple[int, ...]:
    out = []
    for p in prompts:
        out.append(int(answer(lm, p.ids, max_new_tokens=steps).retrieved(p.key)))
        if bar is not None:
            bar.update(1)
    return tuple(out)


def retrieval(lm: LoadedModel, *, n_needles: int = 16, lengths: Sequence[int] = (1200,),
              depths: Sequence[float] = DEFAULT_DEPTHS, corpus: Sequence[str] | None = None, text: str | None = None,
              phrasings: Sequence[Phrasing] = PHRASINGS, seed: int = 0, top: float = 0.05, n_random: int = 10,
              check: bool = True, sensitivity: bool = False, sink: int | None = None, recent: int | None = None,
              fraction: float = 0.5, ranking: Ranking = "retrieval", progress: bool = False) -> RetrievalResult:
    """Retrieval heads, the causal check and a KV plan (see the module). `sink` / `recent`: a streaming head's
    first and last keys (default `default_window` of the model's context).

    >>> from headscope.probe.tiny import tiny_model
    >>> r = retrieval(tiny_model("llama"), n_needles=2, lengths=[100], depths=[0.5], check=False,
    ...               phrasings=[Phrasing("Key {key}.", "Key:")], sink=2, recent=8)
    >>> r.scores.hits.shape, r.check, r.plan.n_full, r.plan.pattern_config()
    ((2, 4), None, 2, {'sink_size': 2, 'recent_size': 8})
    """
    n_needles = whole_number(n_needles, "n_needles", minimum=2)
    n_random = whole_number(n_random, "n_random", minimum=0)
    seed = seed_value(seed)
    if not 0 < top < 1:
        raise ValueError(f"top is a share of the heads in (0, 1), got {top}")
    if ranking not in ("retrieval", "sensitivity"):
        raise ValueError(f"ranking must be 'retrieval' or 'sensitivity', got {ranking!r}")
    if ranking == "sensitivity" and not sensitivity:
        raise ValueError("ranking='sensitivity' needs sensitivity=True (each KV head streamed alone)")
    layout = kv_layout(lm)
    d_sink, d_recent = default_window(lm.max_length)
    sink = d_sink if sink is None else whole_number(sink, "sink", minimum=0)
    recent = d_recent if recent is None else whole_number(recent, "recent", minimum=1)
    lines, held_text = _halves(lm, corpus, text)
    needles = make_needles(n_needles, lengths=lengths, depths=depths, seed=seed, n_lines=len(lines),
                           phrasings=phrasings)
    prompts = [needle_prompt(lm, n, lines) for n in needles]
    selection = [p for p in prompts if p.needle.split == "selection"]
    held = [p for p in prompts if p.needle.split == "held_out"]
    steps = _max_new(lm, prompts)
    n_layers, n_heads = lm.config.num_hidden_layers, lm.config.num_attention_heads
    k = max(1, int(top * n_layers * n_heads))
    total = len(selection) + (len(held) * (2 + n_random) if check else 0)
    bar = progress_bar(total=total, desc="needle answers", enabled=progress, leave=False)
    hits, copies, selection_correct = np.zeros((n_layers, n_heads), np.int64), 0, []
    for p in selection:
        ans = answer(lm, p.ids, max_new_tokens=steps, top_keys=True)
        h, c = retrieval_hits(p, ans)
        hits, copies = hits + h, copies + c
        selection_correct.append(int(ans.retrieved(p.key)))
        bar.update(1)
    scores = RetrievalScores(model=lm.name, hits=hits, copies=copies, n_kv_heads=layout.n_kv_heads,
                             needles=tuple(p.needle.index for p in selection))
    result_check = None
    if check:
        chosen_heads = scores.top(k)
        clean = _correct(lm, held, steps, bar)
        with ablate(lm, chosen_heads):
            chosen = _correct(lm, held, steps, bar)
        sets = random_head_sets(n_layers, n_heads, chosen_heads, k, n_random, seed=seed)
        random = []
        for s in sets:
            with ablate(lm, s):
                random.append(_correct(lm, held, steps, bar))
        result_check = RetrievalCheck(model=lm.name, heads=chosen_heads, clean=clean, chosen=chosen,
                                      random_sets=tuple(sets), random=tuple(random),
                                      extra={"method": "zero", "top": top, "seed": seed})
    bar.close()
    held_ids = list(lm.tokenizer(held_text)["input_ids"])[: max(lengths)]
    sens = stream_sensitivity(lm, held_ids, sink=sink, recent=recent) if sensitivity else None
    planned = np.array(layout.planned)
    rank = scores.kv_score() if ranking == "retrieval" else sens
    plan = KVPlan.from_ranking(rank, fraction, sink=sink, recent=recent, planned=planned,
                               own_window=layout.own_window, name=f"{ranking} {fraction:.0%}")
    settings = {"lengths": [int(x) for x in lengths], "depths": [float(d) for d in depths], "seed": seed,
                "top": top, "k": k, "n_random": n_random, "sink": sink, "recent": recent, "fraction": fraction,
                "max_new_tokens": steps, "pooling": "a KV head's score is the largest of its query heads'",
                "held_out_text_tokens": len(held_ids)}
    return RetrievalResult(model=lm.name, needles=tuple(needles), selection_correct=tuple(selection_correct),
                           scores=scores, check=result_check, sensitivity=sens, plan=plan, ranking=ranking,
                           n_tokens=tuple(p.n_tokens for p in prompts), settings=settings)


def plan_cost(lm: LoadedModel, plans: Sequence[KVPlan], prompts: Sequence[NeedlePrompt], text_ids: Sequence[int],
              *, progress: bool = False) -> pd.DataFrame:
    """What each plan costs: needle accuracy on `prompts` (Wilson 95% interval), perplexity of `text_ids` and the
    change from the full model's, the KV bytes after the longest prompt, and the bytes kept as a share of full."""
    if not plans or not prompts:
        raise ValueError("plan_cost needs at least one plan and one needle prompt")
    layout = kv_layout(lm)
    steps = _max_new(lm, prompts)
    n = max(p.n_tokens for p in prompts)
    full_bytes = KVPlan.all_full(layout.shape, sink=1, recent=1, planned=np.array(layout.planned),
                                 own_window=layout.own_window).kv_bytes(n, head_dim=layout.head_dim,
                                                                        bytes_per_value=layout.bytes_per_value)
    dense = math.exp(float(token_losses(lm, text_ids).mean()))
    rows = []
    for plan in progress_bar(plans, desc="plans", enabled=progress, leave=False):
        with stream_heads(lm, plan):
            ok = _correct(lm, prompts, steps)
        ppl = math.exp(float(token_losses(lm, text_ids, plan).mean()))
        lo, hi = wilson(sum(ok), len(ok))
        b = plan.kv_bytes(n, head_dim=layout.head_dim, bytes_per_value=layout.bytes_per_value)
        rows.append({"plan": plan.name, "fraction_full": plan.fraction_full, "n_full": plan.n_full,
                     "needle_accuracy": sum(ok) / len(ok), "accuracy_low": lo, "accuracy_high": hi, "needles": len(ok),
                     "perplexity": ppl, "perplexity_change": ppl / dense - 1, "kv_bytes": b,
                     "kv_share": b / full_bytes})
    return pd.DataFrame(rows)
