"""min_new_tokens (transformers' MinNewTokensLengthLogitsProcessor): the end token is never chosen before the row has
generated that many tokens. Beams mask it on their log-probabilities without renormalising first, as transformers."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from seqserve.engine.decoding.rule import Rows


@dataclass(frozen=True)
class MinNewTokens:
    eos_id: int
    host = True
    masks = True
    forces = False

    def acts(self, rows: Rows) -> np.ndarray:
        return rows.length < rows.min_new

    def apply(self, scores: np.ndarray, rows: Rows, on: np.ndarray) -> None:
        scores[on, self.eos_id] = -np.inf
