"""A sequence's score, defined once: the server's beams, its return_logprobs path and the PyTorch reference
(model/beam.py) all call score().

    score = cumulative_logprob / n ** length_penalty

n counts the generated tokens the score sums, the end token included (Hugging Face's `length_penalty`: > 0 favours
longer sequences, < 0 shorter ones). It never raises: n is taken as at least 1, an overflowing n ** length_penalty
gives 0.0 of the right sign (or 0.0 for a zero sum), and an underflowing one -inf / inf.
"""
from __future__ import annotations

import numpy as np


def score(cumulative_logprob, n, length_penalty):
    """Floats give a float; arrays (any of the three) give an array, element by element (the same operations, so a
    vector of scores equals the scores one by one)."""
    with np.errstate(over="ignore", under="ignore", divide="ignore", invalid="ignore"):
        cum = np.asarray(cumulative_logprob, np.float64)
        denominator = np.power(np.maximum(np.asarray(n, np.float64), 1.0), np.asarray(length_penalty, np.float64))
        out = np.where(cum == 0.0, 0.0, cum / denominator)  # 0 / 0 (an underflowed power) is a zero sum: 0
    return float(out) if out.ndim == 0 else out
