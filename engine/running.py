"""One record per running request (greedy or sampled): everything the engine keeps for it between steps.

Its text stream (streams and stop strings), the pieces not yet sent, whether it samples, and its log-probabilities.
A request enters when it joins the batch and leaves with one `pop`: nothing is kept in step by hand. Beam requests'
state is the beam component's (engine/beam.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from seqserve.engine.beam import top_alternatives
from seqserve.engine.detokenizer import TextStream
from seqserve.engine.request import FinishReason, Request, Sequence, TokenLogprob


@dataclass(eq=False)
class Running:
    request: Request
    text: TextStream | None = None  # streams and requests with stop strings: the text built token by token
    unsent_ids: list[int] = field(default_factory=list)  # a stream's ids and text not yet handed to its sink
    unsent_text: list[str] = field(default_factory=list)
    logprobs: list[TokenLogprob] | None = None  # with return_logprobs: one per chosen token
    slot: int = -1  # the row it holds, set by the engine at each step

    @property
    def sampled(self) -> bool:
        """Its token is not a plain argmax (sampling.sample_row chooses it)."""
        return not self.request.params.greedy

    @property
    def params(self):
        return self.request.params

    @property
    def forced_bos(self) -> int | None:  # the token rules read a row's own forced first token from its request
        return self.request.forced_bos

    @property
    def rng(self):  # sampling.sample_row's generator lives with the request it draws for
        return self.request.rng

    @rng.setter
    def rng(self, value) -> None:
        self.request.rng = value

    def at(self, slot: int) -> Running:
        self.slot = slot
        return self

    def add_logprob(self, token: int, logprobs: np.ndarray) -> None:
        """The chosen token's log-probability, and the top_logprobs alternatives; logprobs (V,) is the model's."""
        self.logprobs.append(TokenLogprob(token, float(logprobs[token]),
                                          top_alternatives(logprobs, self.params.top_logprobs)))

    def take_unsent(self, ids: tuple[int, ...], piece: str, interval: int, last: bool) -> tuple[list[int], str] | None:
        """Adds a stream's new ids and text; returns what to send now (every interval tokens, and the rest at the
        end), or None."""
        self.unsent_ids += ids
        self.unsent_text.append(piece)
        if not (last or len(self.unsent_ids) >= interval):
            return None
        out = self.unsent_ids, "".join(self.unsent_text)
        self.unsent_ids, self.unsent_text = [], []
        return out

    def sequence(self, output_ids: list[int], text: str, reason: FinishReason, score) -> Sequence:
        """The returned sequence; with return_logprobs, the scored tokens (the returned ones, plus the end token on
        EOS: a stop string cuts no score) with their sum and score(cumulative, n, length_penalty)."""
        if self.logprobs is None:
            return Sequence(output_ids, text, reason)
        track = tuple(self.logprobs[: len(output_ids) + (reason is FinishReason.EOS)])
        cum = sum(t.logprob for t in track)
        return Sequence(output_ids, text, reason, cum, score(cum, len(track), self.params.length_penalty), track)


def views(records) -> tuple[list[Running], ...]:
    """The records by what a step does for them (sampled, scored, with text) and all of those: the engine keeps them
    until a request joins or leaves, so plain greedy rows cost no Python at all per step."""
    records = list(records)
    sampled = [rec for rec in records if rec.sampled]
    scored = [rec for rec in records if rec.logprobs is not None]
    texted = [rec for rec in records if rec.text is not None]
    return sampled, scored, texted, list({*sampled, *scored, *texted})
