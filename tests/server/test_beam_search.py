"""engine/beam.py's candidate selection: the k best, best first, ties to the lower (beam, token) index."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from seqserve.engine.beam import _best


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.lists(st.sampled_from([-np.inf, -3.0, -1.0, -0.5, 0.0]), min_size=1, max_size=40), st.integers(0, 45))
def test_partial_selection_equals_a_full_stable_sort(values, k):
    """Many ties on purpose: the rule must hold at the boundary of the k-th value too."""
    values = np.array(values)
    assert _best(values, k).tolist() == np.argsort(-values, kind="stable")[:k].tolist()
