"""The greedy rows' decider (whisper's GreedyDecoder): the token rules on their logits, then one argmax for them all.

A step whose rows are all greedy and meet no rule never fetched the logits (engine/step_output.py): the graph's own
argmax is the token then.
"""
from __future__ import annotations

import numpy as np

from seqserve.engine.decoding.rule import Rows
from seqserve.engine.decoding.token_rules import TokenRules
from seqserve.engine.step_output import StepOutput


class Greedy:
    def __init__(self, rules: TokenRules) -> None:
        self.rules = rules

    def choose(self, out: StepOutput, rows: Rows, greedy: np.ndarray) -> np.ndarray:
        """(hi,) every row's argmax after the rules acted on the `greedy` rows ((hi,) bool); the other rows' entries
        are their deciders' to overwrite. out.logits (hi, V), when fetched, is changed in place."""
        if out.logits is None:
            return out.ids.copy()
        self.rules.apply(out.logits, rows, greedy)
        return out.logits.argmax(axis=-1)  # (hi,) one vectorised argmax serves every greedy row
