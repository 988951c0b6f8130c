"""Which head follows a relation: choose it on one split, score it on another, test it against a baseline.

Every probe here has the same shape: for each example and each head, an outcome (`correct
[example, layer, head]`: did the head's most-attended word hit the answer?), and a baseline scored
on the same examples (a fixed position, or chance). The method, top to bottom:

1. Choose on one split, score on another. The head with the most correct examples on the
   selection examples is scored on examples it was not chosen on, so its score is not inflated by
   the choice among L x H heads. With a separate held-out set (`choose(..., heldout=)`) the head is
   chosen on all of the selection set and scored on the held-out set. Without one, by k-fold by
   group (`cross_validate`): the head chosen on k-1 folds is scored on the fold left out, and
   pooled over folds every example is scored once by a head chosen without it; a group (a Winograd
   pair, a sentence) never straddles the split (`stats.group_folds`).
2. Ties are broken by a seeded rank (`head_rank`): a fixed random order of the heads that depends
   on the seed only, never on the data, so the permutation tests below can re-run the very same
   choice (a data-driven tie-break such as the attention margin could not be permuted).
3. Permutation p-values, one-sided, of "the chosen head beats the baseline" (`p_value`). Under H0
   (no head tells more than the baseline) the null is drawn the same way for every head, which
   keeps the dependence between heads: against a paired baseline (`Paired`) each example's head
   and baseline outcomes are swapped at random (a sign flip of their difference); against chance
   among candidates (`Chance`) the answer is redrawn uniformly among each example's candidates.
   With a held-out set nothing was chosen on the scored examples, so the chosen head's outcomes
   are tested as they are. Under k-fold they are not independent (the fold choices share data; on
   pure noise testing them as if independent rejected 7 times in 40 at alpha = 0.05), so every
   permutation re-runs the k-fold choice and recomputes the pooled held-out score
   (`stats.cv_signflip_p`, `stats.cv_relabel_p`). `p_value_max` corroborates with max-T over all
   heads (Westfall-Young): the statistic is the best head's advantage, which accounts for the
   L x H choice with no split at all.
4. Holm over tests (`stats.holm`): a caller that tests many relations at once adjusts their
   p-values for the family-wise error (`analyses.syntax` does, over relations and directions).
5. A head *beats the baseline* when its p-value is below alpha and it is right more often than
   the baseline (`beats_baseline`); the verdict says so in words, or says "no head beats the
   baseline", or that there were too few examples to crown a head at all. The pieces of those
   sentences that every probe shares are here (`chosen_head`, `heldout_score`, `no_head_beats`,
   `too_few`); each probe composes its own sentence from them (`analyses.coref`, `analyses.syntax`).

Nothing here touches a model or knows what an example is: only outcome tensors, groups and ranks.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Literal, Sequence

import torch

from headscope.probe.types import head_name

from .stats import cv_choices, cv_relabel_p, cv_signflip_p, group_folds, ranked_argmax, relabel_max_p, signflip_max_p

__all__ = [
    "Scheme",
    "Selection",
    "Paired",
    "Chance",
    "head_rank",
    "select_head",
    "cross_validate",
    "choose",
    "p_value",
    "p_value_max",
    "beats_baseline",
    "chosen_head",
    "heldout_score",
    "no_head_beats",
    "too_few",
]

Scheme = Literal["heldout", "kfold"]


# --------------------------------------------------------------------------------------------
# Ranking and choosing


def head_rank(n_layers: int, n_heads: int, *, seed: int = 0) -> torch.Tensor:
    """A fixed random order of the heads, `[layer * n_heads + head]`, that breaks ties in accuracy.

    It depends on the seed only, never on the data, so the permutation tests can re-run the very
    same selection (a data-driven tie-break such as the attention margin could not be permuted).
    """
    return torch.randperm(n_layers * n_heads, generator=torch.Generator().manual_seed(seed)).to(torch.float64)


def select_head(correct: torch.Tensor, rank: torch.Tensor | None = None) -> tuple[int, int]:
    """Axis positions (layer, head) of the most accurate head; ties go to the higher `rank`.

    >>> c = torch.tensor([[[True, False], [True, True]]])      # [example=1, layer=2, head=2]
    >>> select_head(c, torch.tensor([0.0, 1.0, 3.0, 2.0]))
    (1, 0)
    """
    n_heads = correct.shape[2]
    flat = correct.flatten(1).to(torch.float64).sum(0)  # [layer * head]
    rank = torch.zeros_like(flat) if rank is None else torch.as_tensor(rank, dtype=torch.float64)
    return divmod(int(ranked_argmax(flat.numpy(), rank.numpy())), n_heads)


def cross_validate(
    correct: torch.Tensor, folds: Sequence[int], rank: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, list[tuple[int, int]]]:
    """Choose a head on all folds but one, score it on that one.

    Returns `(heldout_correct [example], heldout_head [example, 2], choice per fold)`; every
    example is scored once, by the head chosen without it.
    """
    n_heads = correct.shape[2]
    rank = torch.zeros(correct.shape[1] * n_heads, dtype=torch.float64) if rank is None else rank
    fold = torch.tensor(list(folds))
    choices = [divmod(c, n_heads) for c in cv_choices(correct.flatten(1), folds, rank)]
    out = torch.zeros(correct.shape[0], dtype=torch.bool)
    which = torch.zeros(correct.shape[0], 2, dtype=torch.long)
    for f, (li, hi) in zip(sorted(set(fold.tolist())), choices):
        test = fold == f
        out[test] = correct[test, li, hi]
        which[test] = torch.tensor([li, hi])
    return out, which, choices


@dataclass(frozen=True, eq=False)
class Selection:
    """How the head was chosen (`choose`) and the outcomes it is judged on.

    `correct[example, layer, head]` covers the examples the chosen head is scored on (the held-out
    set; under k-fold all of them), `heldout_correct[example]` the chosen head's outcome on each,
    `choices` the axis positions chosen (one per fold, or the one head), `folds` the fold of each
    example under k-fold (None with a held-out set). `usable` is false when no head could be
    chosen and scored honestly (no example on one side, or too few groups to split).
    """

    scheme: Scheme
    correct: torch.Tensor  # [example, layer, head] on the scored examples
    heldout_correct: torch.Tensor  # [example]
    choices: tuple[tuple[int, int], ...]
    folds: tuple[int, ...] | None
    description: str
    usable: bool


def choose(correct: torch.Tensor, *, groups: Sequence[str], rank: torch.Tensor,
           heldout: torch.Tensor | None = None, folds: int = 5, seed: int = 0) -> Selection:
    """Choose a head on `correct` (`[example, layer, head]`) and score it where it was not chosen.

    With `heldout` (the outcomes of the same heads on other examples) the head is chosen on all of
    `correct` and scored on `heldout`; `groups` is then not used. Without, k-fold by `groups` (one
    per example): `folds` folds, fewer when there are fewer groups, and no split (not usable) with
    fewer than two. `seed` deals the groups to folds.

    >>> correct = torch.tensor([[[True, False]], [[True, False]], [[False, True]], [[True, False]]])
    >>> sel = choose(correct, groups=["a", "a", "b", "c"], rank=torch.tensor([0.0, 1.0]), folds=2)
    >>> sel.folds   # group a (two examples) in one fold, b and c in the other
    (0, 0, 1, 1)
    >>> sel.description, sel.choices, sel.heldout_correct.tolist()   # fold 0: a tie on b, c, won by rank
    ('2-fold by group (3 groups)', ((0, 1), (0, 0)), [False, False, False, True])
    >>> choose(correct, groups=["a"] * 4, rank=torch.tensor([0.0, 1.0])).description
    'no split possible (1 group(s))'
    """
    if heldout is not None:
        li, hi = select_head(correct, rank) if len(correct) else (0, 0)
        return Selection("heldout", heldout, heldout[:, li, hi], ((li, hi),), None,
                         f"chosen on {len(correct)} examples, scored on {len(heldout)} others",
                         len(correct) > 0 and len(heldout) > 0)
    n_groups = len(set(groups))
    k = min(folds, n_groups)
    if k < 2:
        return Selection("kfold", correct, torch.zeros(len(correct), dtype=torch.bool), (), None,
                         f"no split possible ({n_groups} group(s))", False)
    fold_of = group_folds(list(groups), k, seed=seed)
    h_correct, _, choices = cross_validate(correct, fold_of, rank)
    return Selection("kfold", correct, h_correct, tuple(choices), tuple(fold_of),
                     f"{k}-fold by group ({n_groups} groups)", True)


# --------------------------------------------------------------------------------------------
# Tests against a baseline


@dataclass(frozen=True, eq=False)
class Paired:
    """A baseline scored on the same examples: its `outcome[example]` (1 right, 0 wrong).

    Under H0 a head's and the baseline's outcomes on an example are exchangeable: a sign flip of
    their difference, the same flip for every head (`stats.signflip_max_p`).
    """

    outcome: torch.Tensor  # [example]


@dataclass(frozen=True, eq=False)
class Chance:
    """Chance among each example's candidates: each head's `picks[example, layer, head]` (-1 for
    none), the right `answers[example]` and `n_candidates[example]`.

    Under H0 attention says nothing about which candidate is right: the answer is redrawn uniformly
    among the candidates, the same draw for every head (`stats.relabel_max_p`).
    """

    picks: torch.Tensor  # [example, layer, head]
    answers: torch.Tensor  # [example]
    n_candidates: torch.Tensor  # [example]


def _paired_diff(sel: Selection, null: Paired) -> torch.Tensor:
    return sel.correct.flatten(1).to(torch.float64) - null.outcome.to(torch.float64)[:, None]  # [example, head]


def p_value(sel: Selection, null: Paired | Chance, *, rank: torch.Tensor, n_perm: int = 10_000,
            seed: int = 0) -> float:
    """One-sided permutation p-value of "the chosen head beats the baseline" on the scored examples.

    With a held-out set: the plain test of the chosen head's outcomes (nothing was chosen on them).
    Under k-fold: every permutation re-runs the k-fold choice (ties by `rank`) and recomputes the
    pooled held-out score, so the p-value is that of the whole procedure.

    >>> correct = torch.ones(20, 1, 2, dtype=torch.bool)             # both heads right on 20 examples
    >>> sel = choose(correct[:1], groups=[], rank=torch.tensor([0.0, 1.0]), heldout=correct)
    >>> p_value(sel, Paired(torch.zeros(20)), rank=torch.tensor([0.0, 1.0]), n_perm=99)   # the baseline never
    0.01
    """
    kw = dict(n_perm=n_perm, seed=seed)
    if isinstance(null, Chance):
        if sel.scheme == "heldout":
            li, hi = sel.choices[0]
            return relabel_max_p(null.picks[:, li, hi][:, None], null.answers, null.n_candidates, **kw)
        return cv_relabel_p(null.picks.flatten(1), null.answers, null.n_candidates, sel.folds, rank, **kw)
    if sel.scheme == "heldout":
        return signflip_max_p(sel.heldout_correct.to(torch.float64) - null.outcome, **kw)
    return cv_signflip_p(_paired_diff(sel, null), sel.folds, rank, **kw)


def p_value_max(sel: Selection, null: Paired | Chance, *, n_perm: int = 10_000, seed: int = 0) -> float:
    """Westfall-Young max-T p-value over all heads on the scored examples (no split): the statistic
    is the best head's advantage over the baseline, under the same null draws as `p_value`."""
    kw = dict(n_perm=n_perm, seed=seed)
    if isinstance(null, Chance):
        return relabel_max_p(null.picks.flatten(1), null.answers, null.n_candidates, **kw)
    return signflip_max_p(_paired_diff(sel, null), **kw)


def beats_baseline(p: float | None, score: float, baseline: float, *, alpha: float) -> bool:
    """Whether a chosen head beats its baseline: a p-value below `alpha` and a higher score.

    >>> [beats_baseline(p, score, 20, alpha=0.05) for p, score in [(0.01, 30), (0.01, 20), (0.2, 30), (None, 30)]]
    [True, False, False, False]
    """
    return bool(p is not None and p < alpha and score > baseline)


# --------------------------------------------------------------------------------------------
# The shared words of a verdict


def chosen_head(best: tuple[int, int], fold_heads: Sequence[tuple[int, int]] | None, *,
                on: str = "the selection set") -> str:
    """How the scored head was chosen, in words (model indices).

    `fold_heads` None: chosen on a separate split (`on`). Else the head of each fold: one head
    chosen in every fold is named as such; several are tallied, with `best` (the choice on all data).

    >>> chosen_head((1, 2), None)
    'L1H2 (chosen on the selection set)'
    >>> chosen_head((1, 2), [(1, 2)] * 5)
    'L1H2 (chosen in all 5 folds)'
    >>> chosen_head((1, 2), [(1, 2), (0, 3), (1, 2)])
    'the head chosen on the other folds (L1H2 in 2, L0H3 in 1 of 3 folds; L1H2 on all data)'
    """
    if fold_heads is None:
        return f"{head_name(*best)} (chosen on {on})"
    tally = Counter(fold_heads)
    if len(tally) == 1 and best in tally:
        return f"{head_name(*best)} (chosen in all {len(fold_heads)} folds)"
    picks = ", ".join(f"{head_name(*h)} in {k}" for h, k in tally.most_common())
    return f"the head chosen on the other folds ({picks} of {len(fold_heads)} folds; {head_name(*best)} on all data)"


def heldout_score(correct: int, n: int, ci: tuple[float, float], noun: str) -> str:
    """The chosen head's held-out score with its 95% interval.

    >>> heldout_score(12, 20, (0.387, 0.781), "pronouns")
    '12/20 held-out pronouns (60%, 95% CI 39%–78%)'
    """
    return f"{correct}/{n} held-out {noun} ({correct / n:.0%}, 95% CI {ci[0]:.0%}–{ci[1]:.0%})"


def no_head_beats(claim: str, baseline: str, baseline_gets: str, tests: str, *, against: str = "baseline") -> str:
    """The sentence for a chosen head that does not beat its baseline.

    >>> no_head_beats("L0H1 finds 11/20", "the +1 offset", "10/20", "p = 0.4")
    'no head beats the baseline: L0H1 finds 11/20; the +1 offset gets 10/20 (p = 0.4).'
    """
    return f"no head beats the {against}: {claim}; {baseline} gets {baseline_gets} ({tests})."


def too_few(detail: str) -> str:
    """The sentence for too few examples to crown any head; `detail` follows the words (with its
    own punctuation).

    >>> too_few(": 12 held-out example(s), at least 20 needed")
    'too few examples to crown a head: 12 held-out example(s), at least 20 needed — not a claim.'
    """
    return f"too few examples to crown a head{detail} — not a claim."
