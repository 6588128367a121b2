"""The greedy-token comparison of `seqserve verify --checkpoint`: a row may diverge only where the reference's logits
of its token and of the engine's token are within the tolerance; the margin is reported; non-finite logits fail."""
from __future__ import annotations

import numpy as np

from seqserve.checks.greedy_match import match_row, summarise

ATOL = RTOL = 1e-4
V = 6


def _logits(chosen: list[int], runner_up: dict[int, tuple[int, float]] | None = None) -> np.ndarray:
    """(T, V) reference logits whose argmax at step t is chosen[t] (logit 3.0, the others 0.0 or below); runner_up
    {t: (token, gap)} puts another token `gap` under the top at step t."""
    logits = np.zeros((len(chosen), V), np.float32)
    for t, token in enumerate(chosen):
        logits[t, token] = 3.0
    for t, (token, gap) in (runner_up or {}).items():
        logits[t, token] = np.float32(3.0) - np.float32(gap)
    return logits


def test_identical_rows_match_without_a_margin():
    m = match_row([1, 2, 0], [1, 2, 0], _logits([1, 2, 0]), ATOL, RTOL)
    assert m.ok and m.identical and m.diverged_at is None


def test_a_divergence_at_a_near_tie_passes_and_reports_its_margin():
    want, got = [1, 2, 3, 3, 0], [1, 2, 4, 4, 4]  # the engine took token 4 at step 2, then went its own way
    m = match_row(got, want, _logits(want, {2: (4, 2e-5)}), ATOL, RTOL)
    assert m.ok and not m.identical and m.diverged_at == 2
    assert abs(m.margin - 2e-5) < 1e-6 and abs(m.limit - (ATOL + RTOL * 3.0)) < 1e-9
    value, ok = summarise([m, match_row(want, want, _logits(want), ATOL, RTOL)], 5)
    assert ok and value.startswith("1/2 sequences identical (up to 5 tokens), 1 diverge at a near-tie")
    assert "margin 2.00e-05 at token 2, limit 4.00e-04" in value


def test_a_divergence_beyond_the_tolerance_fails():
    want, got = [1, 2, 3, 0], [1, 2, 4, 0]
    m = match_row(got, want, _logits(want, {2: (4, 1e-3)}), ATOL, RTOL)  # 1e-3 > 1e-4 + 1e-4 * 3
    assert not m.ok and m.diverged_at == 2 and abs(m.margin - 1e-3) < 1e-6
    value, ok = summarise([m], 4)
    assert not ok and "token 2 differs, margin 1.00e-03 > limit 4.00e-04" in value


def test_a_divergence_onto_a_third_token_fails_even_when_the_top_two_tie():
    want, got = [1, 2], [1, 5]
    logits = _logits(want, {1: (3, 0.0)})  # tokens 2 and 3 tie exactly; the engine chose 5, far below
    assert not match_row(got, want, logits, ATOL, RTOL).ok


def test_a_banned_token_is_never_a_tie():
    want, got = [1, 2], [1, 4]
    logits = _logits(want)
    logits[1, 4] = -np.inf  # a token rule masked it: choosing it is a bug whatever its raw logit was
    m = match_row(got, want, logits, ATOL, RTOL)
    assert not m.ok and m.margin == np.inf


def test_a_length_difference_without_a_differing_token_fails():
    assert not match_row([1, 2], [1, 2, 0], _logits([1, 2, 0]), ATOL, RTOL).ok
    assert summarise([match_row([1, 2], [1, 2, 0], _logits([1, 2, 0]), ATOL, RTOL)], 3)[0].endswith(
        "1 differ (lengths differ)")


def test_nan_logits_fail_even_when_both_sides_agree():
    """argmax of a NaN row is the NaN's index on both sides: equal tokens prove nothing then."""
    want = [1, 2, 0]
    logits = _logits(want)
    logits[1, 4] = np.nan
    m = match_row(want, want, logits, ATOL, RTOL)
    assert m.identical and not m.finite and not m.ok
    value, ok = summarise([m], 3)
    assert not ok and "non-finite reference logits" in value
    logits = _logits(want, {1: (4, 1e-5)})
    logits[1, 2] = np.nan  # a NaN at the divergence: its margin is NaN, which no tolerance admits
    assert not match_row([1, 4, 0], want, logits, ATOL, RTOL).ok
    logits = _logits(want)
    logits[0, 3] = np.inf
    assert not match_row(want, want, logits, ATOL, RTOL).ok


def test_steps_after_the_divergence_are_not_compared():
    want, got = [1, 2, 3], [1, 4, 4]
    logits = _logits(want, {1: (4, 1e-5)})
    logits[2] = np.nan  # beyond the tie: the reference's step 2 followed a prefix the engine never had
    assert match_row(got, want, logits, ATOL, RTOL).ok
