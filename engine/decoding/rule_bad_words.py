"""bad_words_ids (transformers' NoBadWordsLogitsProcessor; contract/generation.py admits single-token entries only):
those ids are never chosen, by any row."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from seqserve.engine.decoding.rule import Rows


@dataclass(frozen=True)
class BadWords:
    ids: tuple[int, ...]
    host = True
    masks = True
    forces = False

    def acts(self, rows: Rows) -> np.ndarray:
        return np.ones(len(rows), bool)

    def apply(self, scores: np.ndarray, rows: Rows, on: np.ndarray) -> None:
        scores[np.ix_(np.flatnonzero(on), list(self.ids))] = -np.inf
