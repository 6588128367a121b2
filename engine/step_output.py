"""What one decoder step hands back to the host, and what a step asks for (the fewer bytes, the less a GPU waits).

A decoder graph with the token-choice outputs (contract/names.py) lets a step copy only what its rows need:
    IDS     every row greedy, no token rule acting on a row (TokenRules.need_logits): each row's argmax id (batch,)
    TOP     beams, no rule acting: the ids above plus each row's TOP_K best ids and their log-probabilities
    LOGITS  anything else (sampling, a token rule acting, log-probabilities): the logits (batch, vocab)
A graph without them (a bundle exported before them, or a CPU graph) always gives LOGITS.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np

from seqserve.contract import names


class Need(enum.IntEnum):
    IDS = 0
    TOP = 1
    LOGITS = 2


FETCHES = {Need.IDS: (names.NEXT_TOKEN_IDS,), Need.TOP: (names.NEXT_TOKEN_IDS, names.TOP_TOKEN_IDS, names.TOP_LOGPROBS),
           Need.LOGITS: (names.LOGITS,)}  # the outputs each need copies to the host


@dataclass
class StepOutput:
    """Rows [0, hi) of the step's host outputs; what was not fetched is None (a free slot's rows are noise)."""

    logits: np.ndarray | None = None  # (hi, V) float32
    ids: np.ndarray | None = None  # (hi,) int64: each row's argmax
    top_ids: np.ndarray | None = None  # (hi, TOP_K) int64, best first
    top_logprobs: np.ndarray | None = None  # (hi, TOP_K) float32

    def head(self, hi: int) -> StepOutput:
        return StepOutput(*(None if v is None else v[:hi] for v in (self.logits, self.ids, self.top_ids,
                                                                    self.top_logprobs)))
