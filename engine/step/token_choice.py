"""Token choice for one step: one decider per kind of row, as whisper's TokenDecoder, each called only when rows of
its kind run: greedy rows (engine/decoding/greedy.py: one argmax after the token rules), sampled rows
(engine/decoding/sampling.py:
each its own draw) and beam rows (engine/decoding/beam.py: one vector step for every beam request). A step with no beam
request runs no beam or n-best code. Also what a step asks the decoder for (engine/step_output.py)."""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from seqserve.engine.decoding.beam import Beams
from seqserve.engine.decoding.greedy import Greedy
from seqserve.engine.decoding.nbest import BeamResult
from seqserve.engine.decoding.rule import Rows
from seqserve.engine.decoding.sampling import Sampler, log_softmax
from seqserve.engine.decoding.token_rules import TokenRules
from seqserve.engine.runtime.runner import Runner
from seqserve.engine.step.running import Running
from seqserve.engine.step_output import Need, StepOutput


class TokenChoice:
    def __init__(self, runner: Runner, rules: TokenRules, beams: Beams) -> None:
        self.runner, self.rules, self.beams = runner, rules, beams
        self.greedy, self.sampler = Greedy(rules), Sampler(rules, runner.slots)

    def need(self, sampled: list[Running], scored: list[Running], beaming: bool) -> Need:
        """What this step's rows need from the decoder (step_output.py): ids when every row is greedy and no token
        rule acts on them, the top-k when beam requests run and no rule acts, else the logits (the host path)."""
        if not self.runner.token_choice:
            return Need.LOGITS
        slots, hi = self.runner.slots, self.runner.slots.hi
        if sampled or scored or self.rules.need_logits(Rows.of(slots, hi), slots.live[:hi]):
            return Need.LOGITS
        if not beaming:
            return Need.IDS
        return Need.LOGITS if self.beams.needs_logits() else Need.TOP

    def choose(self, out: StepOutput, sampled: list[Running], scored: list[Running], each: Callable,
               beaming: bool) -> tuple[np.ndarray, np.ndarray, dict]:
        """(chosen (hi,) every greedy and sampled row's token, single (hi,) bool those rows (beams: advance), the
        scored records' log-probabilities (V,) before any rule). each: the per-request guard (isolation.py);
        beaming: beam requests run this step."""
        slots, hi = self.runner.slots, self.runner.slots.hi
        single = slots.live[:hi] & ~self.beams.owns() if beaming else slots.live[:hi]  # (hi,) beams: advance
        lps = {rec: log_softmax(out.logits[rec.slot]) for rec in scored}  # the model's, before anything masks them
        greedy = single & ~slots.sampled[:hi]  # (hi,) the rules act on their logits in place (sampled rows: on a
        # float64 copy; beams: on log-probabilities)
        chosen = self.greedy.choose(out, Rows.of(slots, hi), greedy) if greedy.any() else np.zeros(hi, np.int64)
        if sampled:  # (each kind is skipped outright when no row of it runs: batch 1 pays per call)
            each(sampled, lambda rec: self.sampler.choose(rec, out.logits, chosen))
        return chosen, single, lps

    def advance(self, out: StepOutput) -> list[BeamResult]:
        """Every beam request takes its step (one vector step for them all); returns those that ended."""
        return self.beams.advance(out.logits if out.logits is not None else out)
