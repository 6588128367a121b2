"""Sampled rows never return <pad>, <s>, <unk> or the decoder start token, however likely the model makes them (the
end token and a forced first token stay possible). Greedy and beam rows follow the model's argmax, as transformers'."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from seqserve.engine.decoding.rule import Rows


@dataclass(frozen=True)
class NeverSampled:
    ids: np.ndarray  # (K,) int64
    host = True
    masks = True
    forces = False

    @staticmethod
    def ids_for(special: dict, forced_bos: int | None = None, banned: tuple[int, ...] = ()) -> np.ndarray:
        """(K,) the special ids but the end token (and the model's forced first token), plus the banned ones."""
        ids = {special[k] for k in ("pad_id", "bos_id", "unk_id")} | {special.get("decoder_start_id",
                                                                               special["bos_id"])}
        ids = (ids - {special["eos_id"], forced_bos}) | set(banned)
        return np.array(sorted(ids), np.int64)

    def acts(self, rows: Rows) -> np.ndarray:
        return rows.sampled if self.ids.size else np.zeros(len(rows), bool)

    def apply(self, scores: np.ndarray, rows: Rows, on: np.ndarray) -> None:
        scores[np.ix_(np.flatnonzero(on), self.ids)] = -np.inf
