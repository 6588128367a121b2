"""Token choice for one step: greedy rows by one vectorised argmax after the token rules, sampled rows by their own
draw (engine/sampling.py), beam rows by the beam step (engine/beam.py); and what a step asks the decoder for."""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from seqserve.engine.beam import Beams
from seqserve.engine.nbest import BeamResult
from seqserve.engine.rule import Rows
from seqserve.engine.runner import Runner
from seqserve.engine.running import Running
from seqserve.engine.sampling import log_softmax, sample_row
from seqserve.engine.step_output import Need, StepOutput
from seqserve.engine.token_rules import TokenRules


class TokenChoice:
    def __init__(self, runner: Runner, rules: TokenRules, banned: np.ndarray, eos_id: int, beams: Beams) -> None:
        self.runner, self.rules, self.banned, self.eos_id, self.beams = runner, rules, banned, eos_id, beams

    def need(self, sampled: list[Running], scored: list[Running]) -> Need:
        """What this step's rows need from the decoder (step_output.py): ids when every row is greedy and no token
        rule acts on them, the top-k when beam requests run and no rule acts, else the logits (the host path)."""
        if not self.runner.token_choice:
            return Need.LOGITS
        slots, hi = self.runner.slots, self.runner.slots.hi
        if sampled or scored or self.rules.need_logits(Rows.of(slots, hi), slots.live[:hi]):
            return Need.LOGITS
        if not self.beams.owns().any():
            return Need.IDS
        return Need.LOGITS if self.beams.needs_logits() else Need.TOP

    def choose(self, out: StepOutput, sampled: list[Running], scored: list[Running],
               each: Callable) -> tuple[np.ndarray, np.ndarray, dict]:
        """(chosen (hi,) every greedy and sampled row's token, single (hi,) bool those rows (beams: advance), the
        scored records' log-probabilities (V,) before any rule). each: the per-request guard (isolation.py)."""
        slots, hi = self.runner.slots, self.runner.slots.hi
        single = slots.live[:hi] & ~self.beams.owns()  # (hi,) rows whose token is chosen here (beams: advance)
        logits, lps = out.logits, {}
        if logits is None:  # need() saw no row whose choice reads the logits: the graph's argmax is the token
            chosen = out.ids.copy()
        else:
            lps = {rec: log_softmax(logits[rec.slot]) for rec in scored}  # the model's, before anything masks them
            # greedy rows: the token rules on their logits (sampled rows: on a float64 copy in _sample; beams: on
            # their log-probabilities)
            self.rules.apply(logits[:hi], Rows.of(slots, hi), single & ~slots.sampled[:hi])
            chosen = logits.argmax(axis=-1)  # (hi,) one vectorised argmax serves every greedy row
        if sampled:  # (each phase is skipped outright when no row needs it: batch 1 pays per call)
            each(sampled, lambda rec: self._sample(rec, logits, chosen))
        return chosen, single, lps

    def _sample(self, rec: Running, logits: np.ndarray, chosen: np.ndarray) -> None:
        s, slots, r = rec.slot, self.runner.slots, rec.request
        chosen[s] = sample_row(logits[s], r.params, rec.rng, slots.ids[s, 1 : 1 + slots.length[s]], self.eos_id,
                               self.banned, self.rules, r.forced_bos)

    def advance(self, out: StepOutput, now: float) -> list[BeamResult]:
        """Every beam request takes its step (one vector step for them all); returns those that ended."""
        return self.beams.advance(out.logits if out.logits is not None else out, now)
