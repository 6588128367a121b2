"""engine/decoding/beam.py's candidate selection: the k best, best first, ties to the lower (beam, token) index."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from seqserve.engine.decoding.beam import _best, _top_tokens


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.lists(st.sampled_from([-np.inf, -3.0, -1.0, -0.5, 0.0]), min_size=1, max_size=40), st.integers(0, 45))
def test_partial_selection_equals_a_full_stable_sort(values, k):
    """Many ties on purpose: the rule must hold at the boundary of the k-th value too."""
    values = np.array(values)
    assert _best(values, k).tolist() == np.argsort(-values, kind="stable")[:k].tolist()


@pytest.mark.parametrize("vocab", [3000, 8000, 32_003])
@pytest.mark.parametrize("kind", ["normal", "few levels", "mostly banned", "ascending"])
def test_each_beams_best_tokens_equal_a_full_stable_sort(vocab, kind):
    """_top_tokens over a vocabulary large enough for its grouped search: each row's k best ids (ties to the lower
    id) as a full stable sort of the row finds them, whatever the ties, bans (-inf) and order of the values."""
    rng = np.random.default_rng([vocab, len(kind)])
    rows, k = 24, 8
    x = rng.normal(0.0, 2.0, (rows, vocab))
    if kind == "few levels":
        x = rng.choice([0.0, -0.5, -1.0, -4.0], (rows, vocab)) - (rng.random((rows, vocab)) < 0.999) * 2.0
    elif kind == "mostly banned":
        x[rng.random((rows, vocab)) < 0.998] = -np.inf
    elif kind == "ascending":
        x = np.sort(x, axis=1)
    raw = x.astype(np.float32)
    top = raw.max(axis=1, keepdims=True).astype(np.float64)
    expected = np.sort(np.argsort(-raw.astype(np.float64), axis=1, kind="stable")[:, :k], axis=1)
    assert _top_tokens(raw, top, k).tolist() == expected.tolist()
