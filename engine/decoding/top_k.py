"""The k best tokens of one step, ties to the lower id: what a row's top_logprobs alternatives and the beam step's
exact tie-breaks share (greedy and sampled rows reach it without any beam code), and the beam step's search space."""
from __future__ import annotations

import numpy as np

BLOCK = 64  # candidates: ids per group whose maximum ranks the group


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


def candidates(raw: np.ndarray, m: int) -> np.ndarray | None:
    """(R, W) ids, W << V, among which lie each row's m largest values (as a multiset), or None for a vocabulary too
    small to gain. Ids split into BLOCK-strided groups {j, j + G, j + 2G, ...} (G = V // BLOCK groups, a max over
    whole rows of a (BLOCK, G) view): the m groups with the largest maxima hold every value above the m-th largest
    and enough equal to it; the last V % BLOCK ids are always in. A whole-vocabulary argpartition per step cost more
    than the int8 decoder step itself."""
    n, vocab = raw.shape
    groups = vocab // BLOCK
    if groups < 4 * m:
        return None
    group_max = raw[:, : groups * BLOCK].reshape(n, BLOCK, groups).max(axis=1)  # (R, G)
    chosen = np.argpartition(group_max, groups - m, axis=1)[:, groups - m :]  # (R, m) the m best groups
    ids = (chosen[:, :, None] + groups * np.arange(BLOCK)).reshape(n, m * BLOCK)  # (R, m BLOCK)
    tail = np.broadcast_to(np.arange(groups * BLOCK, vocab), (n, vocab - groups * BLOCK))  # (R, V % BLOCK)
    return np.concatenate([ids, tail], axis=1)
