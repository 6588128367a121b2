"""renormalize_logits (transformers' LogitNormalization, always last): a beam's log-probabilities are log-softmaxed
again after the other rules. Only log-probabilities: on logits the argmax and the sampler's softmax already
normalise. It needs no host logits of its own (the graph's top-k log-probabilities are normalised already)."""
from __future__ import annotations

import numpy as np

from seqserve.engine.decoding.rule import Rows


def log_softmax(x: np.ndarray) -> np.ndarray:
    """(..., V) -> log-probabilities in float64 (numerically stable)."""
    x = x.astype(np.float64)
    x -= x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


class Renormalize:
    host = False
    masks = False

    def acts(self, rows: Rows) -> np.ndarray:
        return np.full(len(rows), rows.logprobs)

    def apply(self, scores: np.ndarray, rows: Rows, on: np.ndarray) -> None:
        if on.all() and scores.dtype == np.float64:  # the beam step's rows: in place, log_softmax's same operations
            scores -= scores.max(axis=-1, keepdims=True)
            scores -= np.log(np.exp(scores).sum(axis=-1, keepdims=True))
        else:
            scores[on] = log_softmax(scores[on])
