"""The k best tokens of one step, ties to the lower id: what a row's top_logprobs alternatives and the beam step's
exact tie-breaks share (greedy and sampled rows reach it without any beam code)."""
from __future__ import annotations

import numpy as np


def best(values: np.ndarray, k: int, kth: float | None = None) -> np.ndarray:
    """Indices of the k largest values, best first, ties to the lower index: a stable sort of only the values at or
    above the k-th largest (a full sort of the vocabulary every step would cost more than the selection). kth: the
    k-th largest value when the caller knows it (a partition of a vocabulary of equal values is slow)."""
    if k <= 0:
        return np.zeros(0, np.int64)
    if k >= values.size:
        return np.argsort(-values, kind="stable")[:k]
    if kth is None:
        kth = np.partition(values, values.size - k)[values.size - k]
    above = np.flatnonzero(values > kth)  # fewer than k, best first below; then the k-th value's lowest ids
    tied = np.flatnonzero(values == kth)[: k - above.size]  # ascending (a step that bans all but one id ties V)
    return np.concatenate([above[np.argsort(-values[above], kind="stable")], tied])


def top_alternatives(logprobs: np.ndarray, n: int) -> tuple[tuple[int, float], ...]:
    """The n most likely (token, logprob) of one step, the most likely first (ties: the lower id)."""
    if not n:
        return ()
    return tuple((int(t), float(logprobs[t])) for t in best(logprobs, n))
