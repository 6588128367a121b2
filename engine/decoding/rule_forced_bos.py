"""forced_bos_token_id (transformers' ForcedBOSTokenLogitsProcessor): the first generated token is forced. A row may
force its own first token (a multilingual request's target language, Slots.first), which replaces the model's for
that row alone, so rows of different target languages share one batch."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from seqserve.engine.decoding.rule import Rows, force


@dataclass(frozen=True)
class ForcedBOS:
    token: int | None  # the model's forced first token (None: only rows with their own)
    host = True
    masks = False
    forces = True

    def acts(self, rows: Rows) -> np.ndarray:
        starting = rows.length == 0
        return starting if self.token is not None else starting & (rows.first >= 0)

    def apply(self, scores: np.ndarray, rows: Rows, on: np.ndarray) -> None:
        force(scores, on, np.where(rows.first >= 0, rows.first, -1 if self.token is None else self.token))
