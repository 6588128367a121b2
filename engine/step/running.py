"""One record per running request (greedy or sampled): everything the engine keeps for it between steps.

Its text stream (streams and stop strings), the pieces not yet sent, its sampler's generator and its
log-probabilities. A request enters when it joins the batch and leaves with one `pop`: nothing is kept in step by
hand. Beam requests' state is the beam component's (engine/decoding/beam.py). engine/step/outputs.py makes records and
writes what
they produce.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from seqserve.engine.decoding.detokenizer import TextStream
from seqserve.engine.request import Request, TokenLogprob


@dataclass(eq=False)
class Running:
    request: Request
    text: TextStream | None = None  # streams and requests with stop strings: the text built token by token
    unsent_ids: list[int] = field(default_factory=list)  # a stream's ids and text not yet handed to its sink
    unsent_text: list[str] = field(default_factory=list)
    logprobs: list[TokenLogprob] | None = None  # with return_logprobs: one per chosen token
    rng: np.random.Generator | None = None  # sampled rows: seeded from params.seed, one draw per sampled step
    slot: int = -1  # the row it holds, set by the engine at each step

    @property
    def sampled(self) -> bool:
        """Its token is not a plain argmax (sampling.sample_row chooses it)."""
        return not self.request.params.greedy

    def at(self, slot: int) -> Running:
        self.slot = slot
        return self


def views(records) -> tuple[list[Running], ...]:
    """The records by what a step does for them (sampled, scored, with text) and all of those: the engine keeps them
    until a request joins or leaves, so plain greedy rows cost no Python at all per step."""
    records = list(records)
    sampled = [rec for rec in records if rec.sampled]
    scored = [rec for rec in records if rec.logprobs is not None]
    texted = [rec for rec in records if rec.text is not None]
    return sampled, scored, texted, list({*sampled, *scored, *texted})
