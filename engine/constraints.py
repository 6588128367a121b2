"""The model's token rules from its generation_config.json, as a value (bad words, forced BOS/EOS, renormalisation,
rows with their own first token). The rules themselves are classes in server/rule_*.py, kept in their one order by
engine/token_rules.py; `apply` here runs the model's rules of that list on scores (a shortcut for tests and tools)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from seqserve.engine.rule import Rows
from seqserve.engine.rule_never_sampled import NeverSampled
from seqserve.engine.token_rules import TokenRules


@dataclass(frozen=True)
class Constraints:
    banned: tuple[int, ...] = ()  # never chosen
    forced_bos: int | None = None  # the first generated token
    forced_eos: int | None = None  # the token at max_new_tokens (a row that reaches its limit ends with it)
    renormalize: bool = False  # beams: log_softmax again after the rules (HF's renormalize_logits)
    per_row_first: bool = False  # rows may force their own first token (a multilingual model's target language)

    @classmethod
    def from_generation(cls, generation: dict, per_row_first: bool = False) -> Constraints:
        """From the manifest's generation (GenerationDefaults.to_dict(): bad_words_ids are single token ids)."""
        return cls(tuple(int(t) for t in generation.get("bad_words_ids", ())), generation.get("forced_bos_token_id"),
                   generation.get("forced_eos_token_id"), bool(generation.get("renormalize_logits", False)),
                   per_row_first)

    @property
    def generation(self) -> dict:
        """As the manifest's generation: what TokenRules.for_model reads."""
        return {"bad_words_ids": list(self.banned), "forced_bos_token_id": self.forced_bos,
                "forced_eos_token_id": self.forced_eos, "renormalize_logits": self.renormalize}

    @property
    def active(self) -> bool:
        return bool(self.banned) or self.forced_bos is not None or self.forced_eos is not None or self.per_row_first

    def rules(self, special: dict) -> TokenRules:
        """The model's whole ordered list of token rules."""
        return TokenRules.for_model(self.generation, special, self.per_row_first)

    def apply(self, scores: np.ndarray, length: np.ndarray, max_new: np.ndarray,
              rows: np.ndarray | None = None, first: np.ndarray | None = None) -> None:
        """In place: scores (B, V); length (B,) tokens each row generated before this step; max_new (B,) each row's
        limit; rows (B,) bool, the rows to constrain (None: all); first (B,) each row's own forced first token (-1:
        the model's). The model's rules only: no request asks for anything here."""
        n = len(scores)
        at = Rows(length, max_new, np.zeros(n, np.int64), np.full(n, -1) if first is None else first, np.ones(n),
                  np.zeros(n, bool), np.zeros((n, 1), np.int64), np.arange(n))
        nobody = {"pad_id": -1, "bos_id": -1, "unk_id": -1, "eos_id": -1}  # read only by rules these rows never meet
        self.rules(nobody).apply(scores, at, rows)

    def never_sampled(self, special: dict) -> np.ndarray:
        """(K,) ids sampling never returns: the special ids but the end token (and a forced first token), plus the
        banned ones."""
        return NeverSampled.ids_for(special, self.forced_bos, self.banned)
