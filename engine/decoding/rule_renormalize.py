"""renormalize_logits (transformers' LogitNormalization, always last): a beam's log-probabilities are log-softmaxed
again after the other rules. Only log-probabilities: on logits the argmax and the sampler's softmax already
normalise. It needs no host logits of its own (the graph's top-k log-probabilities are normalised already)."""
from __future__ import annotations

import numpy as np

from seqserve.engine.decoding.rule import Rows


def log_softmax(x: np.ndarray) -> np.ndarray:
    """(..., V) -> log-probabilities in float64: x - max in float64 (exact for float32 logits), minus the log of the
    normaliser, whose exponentials are float32 as transformers' own log_softmax (Beams computes the same values)."""
    x = x.astype(np.float64)
    x -= x.max(axis=-1, keepdims=True)
    return x - log_normaliser(x.astype(np.float32))


def _log_softmax64(x: np.ndarray) -> np.ndarray:
    """(..., V) -> log-probabilities, all in float64 (scores that a rule has changed already)."""
    x = x.astype(np.float64)
    x -= x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def log_normaliser(shifted: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """(..., V) float32 x - max -> (..., 1) float64 log(sum(exp)): float32 exponentials summed in float32 (a float64
    exp over 32k words cost a beam step a fifth of its time); out: a float32 scratch for the exponentials."""
    e = np.exp(shifted, out=out)
    return np.log(e.sum(axis=-1, keepdims=True).astype(np.float64))


class Renormalize:
    host = False
    masks = False
    forces = False

    def acts(self, rows: Rows) -> np.ndarray:
        return np.full(len(rows), rows.logprobs)

    def apply(self, scores: np.ndarray, rows: Rows, on: np.ndarray) -> None:
        scores[on] = _log_softmax64(scores[on])  # a beam step with top_logprobs (else Beams takes one log_softmax)
