"""What a token rule (a logits processor) is, and the rows it reads.

A rule changes scores (rows, vocab) in place: the logits of greedy and sampled rows, or a beam's log-probabilities.
`acts` says which rows it changes this step (a vector operation, no Python per row), `apply` changes exactly those.
`host` says whether a row it acts on needs the step's logits on the host (engine/step_output.py): a rule that could
run in the graph would say False. `masks` says it only bans ids (-inf), the same on logits and log-probabilities;
`forces` that it leaves one id per row at 0 and bans the rest, which renormalize_logits then leaves as they are.
engine/decoding/token_rules.py keeps the rules in their one order.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np


@dataclass(frozen=True)
class Rows:
    """The rows one call constrains, aligned with the scores' rows: each (n,) array holds one value per row."""

    length: np.ndarray  # tokens generated before this step
    max_new: np.ndarray  # max_new_tokens
    min_new: np.ndarray  # min_new_tokens
    first: np.ndarray  # the row's own forced first token (a target language's), -1: the model's rule
    penalty: np.ndarray  # repetition_penalty (1: off)
    sampled: np.ndarray  # bool: the token is drawn, not an argmax
    ids: np.ndarray  # (m, 1 + T) BOS then the generated ids, of the rows `at` points into
    at: np.ndarray  # (n,) each scores row's row of ids
    logprobs: bool = False  # the scores are log-probabilities (beam rows), not logits

    @classmethod
    def of(cls, slots, at: np.ndarray | int, logprobs: bool = False) -> Rows:
        """The slots `at` ((n,) indices), or rows [0, at) when it is an int (views, no copy)."""
        pick = slice(0, at) if isinstance(at, int) else at
        return cls(slots.length[pick], slots.max_new[pick], slots.min_new[pick], slots.first[pick],
                   slots.penalty[pick], slots.sampled[pick], slots.ids,
                   np.arange(at) if isinstance(at, int) else at, logprobs)

    @classmethod
    def single(cls, p, generated: np.ndarray, forced: int | None = None) -> Rows:
        """One row from its options p (SamplingParams): generated (T,) the ids it produced so far; forced its own
        forced first token."""
        return cls(np.array([generated.size]), np.array([p.max_new_tokens]), np.array([p.min_new_tokens]),
                   np.array([-1 if forced is None else forced]), np.array([p.repetition_penalty]),
                   np.array([not p.greedy]), np.concatenate(([0], generated))[None], np.zeros(1, np.int64))

    def __len__(self) -> int:
        return self.length.size

    def generated(self, i: int) -> np.ndarray:
        """(length[i],) the ids scores row i generated so far."""
        return self.ids[self.at[i], 1 : 1 + self.length[i]]


class TokenRule(Protocol):
    host: bool  # a row it acts on needs the host logits
    masks: bool  # it only sets scores to -inf, so it acts alike on logits and on log-probabilities
    forces: bool  # it sets one id to 0 and every other to -inf (on logits too, once renormalised)

    def acts(self, rows: Rows) -> np.ndarray:
        """(n,) bool: the rows this rule changes this step."""

    def apply(self, scores: np.ndarray, rows: Rows, on: np.ndarray) -> None:
        """In place on scores (n, V): the rows `on` ((n,) bool, a subset of acts) only."""


def force(scores: np.ndarray, on: np.ndarray, token: np.ndarray | int) -> None:
    """The rows `on` can only choose `token` (one id, or one per row of scores): its score 0, every other -inf (as
    transformers' ForcedBOS/ForcedEOS processors)."""
    at = np.flatnonzero(on)
    scores[at] = -np.inf
    scores[at, token if np.isscalar(token) else token[at]] = 0.0
