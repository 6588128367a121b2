"""The decoding rules defined once (contract/decoding.py): ranges, and the beam rules the server and the PyTorch
reference both enforce."""
from __future__ import annotations

import math

import pytest

from seqserve.contract.decoding import FLOAT_RANGES, LENGTH_PENALTY, TOP_P, Range, beam_problem, lengths_problem


def test_ranges_hold_their_ends_and_refuse_non_finite_values():
    assert -10.0 in LENGTH_PENALTY and 10.0 in LENGTH_PENALTY and 10.000001 not in LENGTH_PENALTY
    assert 0.0 not in TOP_P and 1.0 in TOP_P and str(TOP_P) == "(0, 1]" and str(LENGTH_PENALTY) == "[-10, 10]"
    for r in FLOAT_RANGES.values():
        assert all(v not in r for v in (math.nan, math.inf, -math.inf))
    assert str(Range(0.0, 100.0)) == "[0, 100]"


def test_every_length_penalty_in_range_keeps_n_to_its_power_finite_and_non_zero():
    for n in (1, 2, 1 << 16):
        for lp in (LENGTH_PENALTY.lo, LENGTH_PENALTY.hi):
            assert 0.0 < float(n) ** lp < math.inf


@pytest.mark.parametrize("args, field", [
    ((2, 3, 1.0), "num_return_sequences"), ((1, 2, 1.0), "num_return_sequences"), ((2, 1, 11.0), "length_penalty"),
    ((2, 1, math.nan), "length_penalty"), ((2, 1, 1.0, 0.5), "temperature"),
    ((2, 1, 1.0, 0.0, 1.2), "repetition_penalty"), ((2, 1, 1.0, 0.0, 1.0, ("x",)), "stop"), ((0, 1, 1.0), "num_beams")])
def test_each_broken_beam_rule_names_its_option(args, field):
    assert beam_problem(*args).startswith(field)


def test_valid_options_have_no_problem():
    assert beam_problem(4, 4, -10.0) is None and beam_problem(1, 1, 1.0, 0.7, 1.3, ("x",)) is None
    assert lengths_problem(5, 5) is None and lengths_problem(5, 6).startswith("min_new_tokens")


def test_the_pytorch_reference_refuses_what_the_server_refuses():
    pytest.importorskip("torch")
    from seqserve.model.beam import BeamOptions

    with pytest.raises(ValueError, match=r"^length_penalty must be finite and in \[-10, 10\]"):
        BeamOptions(max_new_tokens=4, num_beams=2, length_penalty=1000.0)
