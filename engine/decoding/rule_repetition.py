"""repetition_penalty (transformers' RepetitionPenaltyLogitsProcessor, CTRL section 4.1): a token the row already
generated has a positive score divided by the penalty and a negative one multiplied by it. Rows asking for it are
never greedy (SamplingParams.greedy) and never beams (contract/decoding.py), so it runs once per such row."""
from __future__ import annotations

import numpy as np

from seqserve.engine.decoding.rule import Rows


class RepetitionPenalty:
    host = True
    masks = False
    forces = False

    def acts(self, rows: Rows) -> np.ndarray:
        return (rows.penalty != 1.0) & (rows.length > 0)

    def apply(self, scores: np.ndarray, rows: Rows, on: np.ndarray) -> None:
        for i in np.flatnonzero(on).tolist():
            seen, p = np.unique(rows.generated(i)), rows.penalty[i]
            x = scores[i, seen]
            scores[i, seen] = np.where(x > 0, x / p, x * p)
