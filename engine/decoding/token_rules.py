"""The one ordered list of token rules (logits processors) every row goes through: greedy and sampled rows on their
logits before the argmax or the draw, beam rows on their log-probabilities before the selection (as transformers'
beam search applies its processors). A new rule is one class in its own file (engine/decoding/rule.py says what one is)
and
one line in `TokenRules.for_model`.

The order is transformers' (generation/utils.py `_get_logits_processor`): repetition penalty, bad words, min new
tokens, forced BOS, forced EOS, and renormalisation last; sampling's never-sampled ids sit with the bad words.
The model's generation defaults choose which model rules are in the list; the request-level ones (repetition
penalty, min_new_tokens, never-sampled ids) are always in it and act on the rows whose request asks.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from seqserve.engine.decoding.rule import Rows, TokenRule
from seqserve.engine.decoding.rule_bad_words import BadWords
from seqserve.engine.decoding.rule_forced_bos import ForcedBOS
from seqserve.engine.decoding.rule_forced_eos import ForcedEOS
from seqserve.engine.decoding.rule_min_new import MinNewTokens
from seqserve.engine.decoding.rule_never_sampled import NeverSampled
from seqserve.engine.decoding.rule_renormalize import Renormalize
from seqserve.engine.decoding.rule_repetition import RepetitionPenalty

__all__ = ["Rows", "TokenRule", "TokenRules"]


@dataclass(frozen=True)
class TokenRules:
    rules: tuple[TokenRule, ...]

    @classmethod
    def for_request(cls, eos_id: int, never_sampled: np.ndarray | None = None) -> TokenRules:
        """Only the request-level rules (a model without generation defaults)."""
        never = np.zeros(0, np.int64) if never_sampled is None else never_sampled
        return cls((RepetitionPenalty(), NeverSampled(never), MinNewTokens(eos_id)))

    @classmethod
    def for_model(cls, generation: dict, special: dict, per_row_first: bool = False) -> TokenRules:
        """From the manifest's generation (GenerationDefaults.to_dict(): bad_words_ids are single token ids) and
        special tokens; per_row_first: rows may force their own first token (a multilingual model)."""
        banned = tuple(int(t) for t in generation.get("bad_words_ids", ()))
        bos, eos = generation.get("forced_bos_token_id"), generation.get("forced_eos_token_id")
        rules: list[TokenRule] = [RepetitionPenalty()]
        if banned:
            rules.append(BadWords(banned))
        rules += [NeverSampled(NeverSampled.ids_for(special, bos, banned)), MinNewTokens(special["eos_id"])]
        if bos is not None or per_row_first:
            rules.append(ForcedBOS(bos))
        if eos is not None:
            rules.append(ForcedEOS(eos))
        if generation.get("renormalize_logits"):
            rules.append(Renormalize())
        return cls(tuple(rules))

    def __add__(self, rule: TokenRule) -> TokenRules:
        return TokenRules(self.rules + (rule,))

    def acting(self, rows: Rows, on: np.ndarray | None = None) -> list[tuple[TokenRule, np.ndarray]]:
        """The rules that change any of these rows (and `on`, (n,) bool, allows) this step, in order, each with the
        (n,) rows it changes."""
        hits = ((rule, rule.acts(rows) if on is None else rule.acts(rows) & on) for rule in self.rules)
        return [(rule, hit) for rule, hit in hits if hit.any()]

    def apply(self, scores: np.ndarray, rows: Rows, on: np.ndarray | None = None,
              acting: list[tuple[TokenRule, np.ndarray]] | None = None) -> None:
        """In place on scores (n, V): each rule in order, on the rows it acts on (acting: `acting(rows, on)`'s answer
        when the caller already has it)."""
        for rule, hit in self.acting(rows, on) if acting is None else acting:
            rule.apply(scores, rows, hit)

    def need_logits(self, rows: Rows, on: np.ndarray | None = None) -> bool:
        """Whether a rule acting on these rows this step needs the step's logits on the host."""
        return any(rule.host for rule, _ in self.acting(rows, on))

    @staticmethod
    def masks_only(acting: list[tuple[TokenRule, np.ndarray]]) -> bool:
        """Whether every acting rule only bans ids (-inf), which acts alike on logits and on log-probabilities."""
        return all(rule.masks for rule, _ in acting)

    @staticmethod
    def masks_then_renormalize(acting: list[tuple[TokenRule, np.ndarray]]) -> bool:
        """Whether the acting rules are bans and forced tokens, then renormalize_logits on every row (an imported
        Marian's beam step): log_softmax of the logits they changed gives the same log-probabilities."""
        return (bool(acting) and isinstance(acting[-1][0], Renormalize) and bool(acting[-1][1].all())
                and all(rule.masks or rule.forces for rule, _ in acting[:-1]))
