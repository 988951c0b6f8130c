"""Head selection and its statistics: Holm over tests, p-values in words, choosing a head, the shared verdict words."""

import math

import numpy as np
import pytest

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
