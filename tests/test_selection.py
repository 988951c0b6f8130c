"""Head selection and its statistics: Holm over tests, p-values in words, choosing a head, the shared verdict words."""

import math

import numpy as np
import pytest
import torch

from headscope.analyses.selection import Chance, Paired, chosen_head, choose, p_value, p_value_max
from headscope.analyses.stats import format_p, holm

# --------------------------------------------------------------------------------------------
# Holm


def test_holm_by_hand_with_ties_and_missing_values():
    # present: 0.02, 0.01, 0.02, 0.5, 0.04 (m = 5); sorted: 0.01 x 5 = 0.05, 0.02 x 4 = 0.08,
    # 0.02 x 3 = 0.06 -> kept at 0.08, 0.04 x 2 = 0.08, 0.5 x 1 = 0.5
    adjusted = holm([0.02, None, 0.01, 0.02, 0.5, 0.04])
    assert adjusted[1] is None
    assert [adjusted[i] for i in (0, 2, 3, 4, 5)] == pytest.approx([0.08, 0.05, 0.08, 0.5, 0.08])
    # capped at 1: 0.6 x 2 = 1.2
    assert holm([0.7, 0.6]) == [1.0, 1.0]
    assert holm([0.4, 0.3]) == pytest.approx([0.6, 0.6])
    assert holm([None, None]) == [None, None] and holm([]) == []


def test_holm_gives_the_same_numbers_for_an_array_with_nan():
    arr = holm(np.array([0.02, np.nan, 0.01, 0.02, 0.5, 0.04]))
    assert isinstance(arr, np.ndarray) and math.isnan(arr[1])
    listed = holm([0.02, None, 0.01, 0.02, 0.5, 0.04])
    assert [float(x) for i, x in enumerate(arr) if i != 1] == [x for x in listed if x is not None]
    assert all(isinstance(x, float) for x in listed if x is not None)
    assert np.isnan(holm(np.array([np.nan, np.nan]))).all()


# --------------------------------------------------------------------------------------------
# p-values in words


def test_format_p_two_digits_and_a_floor():
    assert format_p(0.04567) == "p = 0.046" and format_p(1.0) == "p = 1" and format_p(0.001) == "p = 0.001"
    assert format_p(0.0009) == "p < 0.001" and format_p(0.005, floor=0.01) == "p < 0.01"
    assert format_p(0.0009, floor=None) == "p = 0.0009"


# --------------------------------------------------------------------------------------------
# Choosing a head and testing it


RANK = torch.tensor([0.0, 1.0, 2.0, 3.0])  # [layer * head] of a 2 x 2 model


def _good_head(n: int) -> torch.Tensor:
    """`correct[example, layer=2, head=2]`: head (1, 0) always right, head (0, 1) right on the first example only."""
    correct = torch.zeros(n, 2, 2, dtype=torch.bool)
    correct[:, 1, 0] = True
    correct[0, 0, 1] = True
    return correct


def test_choose_on_a_selection_set_scores_on_the_held_out_set():
    heldout = torch.zeros(3, 2, 2, dtype=torch.bool)
    heldout[0, 1, 0] = True  # the chosen head is right on one held-out example of three
    sel = choose(_good_head(4), groups=(), rank=RANK, heldout=heldout)
    assert sel.scheme == "heldout" and sel.usable and sel.folds is None
    assert sel.choices == ((1, 0),) and sel.heldout_correct.tolist() == [True, False, False]
    assert sel.description == "chosen on 4 examples, scored on 3 others" and sel.correct is heldout
    # nothing to choose on, or nothing to score on: not usable
    assert not choose(_good_head(4)[:0], groups=(), rank=RANK, heldout=heldout).usable
    assert not choose(_good_head(4), groups=(), rank=RANK, heldout=heldout[:0]).usable


def test_choose_needs_two_groups_to_split():
    sel = choose(_good_head(6), groups=["g"] * 6, rank=RANK)
    assert not sel.usable and sel.choices == () and sel.folds is None
    assert sel.description == "no split possible (1 group(s))" and sel.heldout_correct.tolist() == [False] * 6
    # three groups and five folds asked: three folds, the good head chosen in each
    sel = choose(_good_head(6), groups=list("aabbcc"), rank=RANK, folds=5)
    assert sel.usable and sel.description == "3-fold by group (3 groups)" and sel.choices == ((1, 0),) * 3
    assert sel.heldout_correct.all() and sorted(set(sel.folds)) == [0, 1, 2]
    assert chosen_head((1, 0), sel.choices) == "L1H0 (chosen in all 3 folds)"


def test_a_head_no_better_than_its_paired_baseline_gets_p_1():
    # held out: only the chosen head is tested, and it is right exactly where the baseline is, so
    # every sign flip leaves the sum at 0 (the observed value): p = (1 + 99) / (1 + 99)
    correct = _good_head(12)
    baseline = Paired(torch.ones(12))
    sel = choose(correct, groups=(), rank=RANK, heldout=correct)
    assert sel.choices == ((1, 0),) and p_value(sel, baseline, rank=RANK, n_perm=99) == 1.0
    # k-fold: the choice is re-run in every permutation over all heads, so all must match the baseline
    same = torch.ones(12, 2, 2, dtype=torch.bool)
    sel = choose(same, groups=[str(i // 2) for i in range(12)], rank=RANK, folds=3)
    assert p_value(sel, baseline, rank=RANK, n_perm=99) == 1.0
    assert p_value_max(sel, baseline, n_perm=99) == 1.0


@pytest.mark.parametrize("heldout", [False, True])
def test_a_head_always_right_beats_chance_at_the_floor(heldout):
    # 30 examples of two candidates: under H0 a head is right on all of them with chance 2**-30,
    # so no draw of 199 reaches it and p = 1 / (1 + 199)
    n = 30
    answers = torch.tensor([i % 2 for i in range(n)])
    picks = torch.zeros(n, 2, 2, dtype=torch.long)  # every head picks candidate 0 ...
    picks[:, 1, 0] = answers  # ... but head (1, 0) picks the answer
    correct = picks == answers[:, None, None]
    null = Chance(picks, answers, torch.full((n,), 2))
    sel = (choose(correct, groups=(), rank=RANK, heldout=correct) if heldout
           else choose(correct, groups=[str(i // 2) for i in range(n)], rank=RANK, folds=5))
    assert sel.heldout_correct.all()
    assert p_value(sel, null, rank=RANK, n_perm=199) == pytest.approx(1 / 200)
    assert p_value_max(sel, null, n_perm=199) == pytest.approx(1 / 200)
