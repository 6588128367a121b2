"""The token rules a model's generation_config.json asks for, as Hugging Face's logits processors apply them:
bad_words_ids never chosen (NoBadWordsLogitsProcessor, single-token entries), forced_bos_token_id as the first
generated token (ForcedBOSTokenLogitsProcessor), forced_eos_token_id as the last token max_new_tokens allows
(ForcedEOSTokenLogitsProcessor), then renormalize_logits (LogitNormalization). One vectorised pass per step over
every row; greedy and sampling rows apply it to the logits, beam rows to their log-probabilities (as HF does).
A row may carry its own forced first token (a multilingual request's target language), which replaces the model's
forced_bos_token_id for that row alone, so rows with different target languages share one batch."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Constraints:
    banned: tuple[int, ...] = ()  # never chosen
    forced_bos: int | None = None  # the first generated token
    forced_eos: int | None = None  # the token at max_new_tokens (a row that reaches its limit ends with it)
    renormalize: bool = False  # beams: log_softmax again after the rules (HF's renormalize_logits)
    per_row_first: bool = False  # rows may force their own first token (a multilingual model's target language)

    @classmethod
    def from_generation(cls, generation: dict, per_row_first: bool = False) -> "Constraints":
        """From the manifest's generation (GenerationDefaults.to_dict(): bad_words_ids are single token ids)."""
        return cls(tuple(int(t) for t in generation.get("bad_words_ids", ())), generation.get("forced_bos_token_id"),
                   generation.get("forced_eos_token_id"), bool(generation.get("renormalize_logits", False)),
                   per_row_first)

    @property
    def active(self) -> bool:
        return bool(self.banned) or self.forced_bos is not None or self.forced_eos is not None or self.per_row_first

    def apply(self, scores: np.ndarray, length: np.ndarray, max_new: np.ndarray,
              rows: np.ndarray | None = None, first: np.ndarray | None = None) -> None:
        """In place: scores (B, V) logits or log-probabilities; length (B,) tokens each row generated before this
        step; max_new (B,) each row's limit; rows (B,) bool, the rows to constrain (None: all); first (B,) each row's
        own forced first token (-1: the model's). A forced token's score becomes 0 and every other one -inf."""
        mine = np.ones(len(scores), bool) if rows is None else rows  # (B,)
        if self.banned:
            scores[np.ix_(np.flatnonzero(mine), list(self.banned))] = -np.inf
        starting = (length == 0) & mine  # (B,)
        if first is not None and self.per_row_first and starting.any():
            own = starting & (first >= 0)  # (B,) rows that force their own first token
            if own.any():
                at = np.flatnonzero(own)
                scores[at] = -np.inf
                scores[at, first[at]] = 0.0
                starting = starting & ~own
        for token, at in ((self.forced_bos, starting), (self.forced_eos, (length + 1 == max_new) & mine)):
            if token is not None and at.any():
                scores[at] = -np.inf
                scores[at, token] = 0.0

    def never_sampled(self, special: dict) -> np.ndarray:
        """(K,) ids sampling never returns: the special ids but the end token (and a forced first token), plus the
        banned ones."""
        ids = {special[k] for k in ("pad_id", "bos_id", "unk_id")} | {special.get("decoder_start_id",
                                                                               special["bos_id"])}
        ids = (ids - {special["eos_id"], self.forced_bos}) | set(self.banned)
        return np.array(sorted(ids), np.int64)
