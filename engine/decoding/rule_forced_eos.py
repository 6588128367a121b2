"""forced_eos_token_id (transformers' ForcedEOSTokenLogitsProcessor): the last token max_new_tokens allows is forced,
so a row that reaches its limit ends with it (it wins over min_new_tokens: it comes later in the list)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from seqserve.engine.decoding.rule import Rows, force


@dataclass(frozen=True)
class ForcedEOS:
    token: int
    host = True
    masks = False
    forces = True

    def acts(self, rows: Rows) -> np.ndarray:
        return rows.length + 1 == rows.max_new

    def apply(self, scores: np.ndarray, rows: Rows, on: np.ndarray) -> None:
        force(scores, on, self.token)
