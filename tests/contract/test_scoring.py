"""contract/scoring.py: the one score formula, HF's, which never raises."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from seqserve.contract.scoring import score


def test_score_is_the_sum_over_length_to_the_penalty():
    assert score(-6.0, 3, 1.0) == -2.0
    assert score(-6.0, 3, 0.0) == -6.0
    assert score(-6.0, 4, 2.0) == pytest.approx(-6.0 / 16)
    assert score(-6.0, 4, -1.0) == pytest.approx(-24.0)


def test_no_tokens_counts_as_one():
    assert score(0.0, 0, 1.0) == 0.0 and score(-2.0, 0, -3.0) == -2.0


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.floats(-1e6, 0.0), st.integers(0, 100_000), st.floats(-10.0, 10.0))
def test_never_raises_and_is_never_nan_in_the_validated_range(cum, n, penalty):
    value = score(cum, n, penalty)
    assert isinstance(value, float) and not math.isnan(value) and value <= 0.0


@pytest.mark.parametrize("penalty", [1e300, -1e300, 1e4, -1e4])
def test_extreme_penalties_give_zero_or_infinity_instead_of_raising(penalty):
    value = score(-3.0, 7, penalty)
    assert value == (0.0 if penalty > 0 else -math.inf)
    assert score(0.0, 7, penalty) == 0.0


def test_arrays_give_the_same_scores_as_one_by_one():
    rng = np.random.default_rng(0)
    cum, n, penalty = -50 * rng.random(1000), rng.integers(0, 300, 1000), rng.uniform(-10, 10, 1000)
    assert score(cum, n, penalty).tolist() == [score(float(c), int(k), float(p)) for c, k, p in zip(cum, n, penalty)]
