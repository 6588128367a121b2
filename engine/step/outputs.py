"""The one writer of what goes back: stream pieces (every stream_interval tokens), texts, n-best sequences,
log-probabilities and the final Result, as the Outputs of the step's report (Outputs.take, once per step).

The engine decides when a request's token, text or end happens; this module alone turns that into Outputs.
"""
from __future__ import annotations

from collections.abc import Iterable
from collections.abc import Sequence as Seq

import numpy as np
from tokenizers import Tokenizer

from seqserve.contract.scoring import score
from seqserve.engine.decoding.detokenizer import TextStream
from seqserve.engine.decoding.nbest import Hypothesis
from seqserve.engine.decoding.top_k import top_alternatives
from seqserve.engine.request import FinishReason, Output, Request, RequestStatus, Result, Sequence, TokenLogprob
from seqserve.engine.step.running import Running
from seqserve.engine.step.stats import Stats


def end(request: Request, reason: FinishReason, now: float, error: str | None = None,
        sequences: tuple[Sequence, ...] = (), generated: int = 0) -> bool:
    """The one way a request finishes (the engine and the scheduler decide when): its Result is made here, by value;
    the step's report carries it in the request's last Output (Outputs.take). A finished request never ends again:
    False then."""
    if request.done:
        return False

    def since_arrival(t: float | None) -> float:
        return 0.0 if t is None else max(0.0, t - request.arrival)

    request.result = Result(reason, tuple(sequences), request.n_input_tokens, generated, request.params.seed or 0,
                            since_arrival(request.scheduled_at), since_arrival(request.first_token_at),
                            since_arrival(now), error)
    request.status = RequestStatus.FINISHED
    return True


class Outputs:
    def __init__(self, tokenizer: Tokenizer, eos_id: int, stream_interval: int = 1) -> None:
        self.tokenizer, self.eos_id = tokenizer, eos_id
        self.stream_interval = stream_interval  # a stream's message carries this many tokens (the last one fewer)
        self.pending: list[Output] = []  # this step's stream pieces, in order: take() hands them back

    def record(self, request: Request) -> Running:
        """A greedy or sampled request's record as it joins: its text stream (streams and stop strings), its
        log-probabilities (return_logprobs) and its sampler's generator."""
        p = request.params
        return Running(request, TextStream(self.tokenizer, p.stop) if request.stream or p.stop else None,
                       logprobs=[] if p.return_logprobs else None,
                       rng=None if p.greedy else np.random.default_rng(p.seed))

    def logprob(self, rec: Running, token: int, logprobs: np.ndarray) -> None:
        """The chosen token's log-probability, and the top_logprobs alternatives; logprobs (V,) is the model's."""
        rec.logprobs.append(TokenLogprob(token, float(logprobs[token]),
                                         top_alternatives(logprobs, rec.request.params.top_logprobs)))

    def token(self, rec: Running, token: int) -> bool:
        """A row's new token in its text and its stream; True when a stop string appeared (it ends STOP)."""
        piece = rec.text.push(token)
        if self.stream_interval == 1 and rec.request.stream:  # the common stream: this token now, nothing kept
            self.pending.append(Output(rec.request.id, (token,), piece))
        else:
            self._stream(rec, (token,), piece)
        return rec.text.stopped

    def final(self, rec: Running, output_ids: list[int], reason: FinishReason) -> tuple[FinishReason, Sequence]:
        """The row's result: its text (decoded whole once; a stop string in it ends it STOP, and a stream gets the
        rest), and with return_logprobs the scored tokens (the returned ones, plus the end token on EOS: a stop string
        cuts no score) with their sum and score(cumulative, n, length_penalty)."""
        if rec.text is None:
            text = self.tokenizer.decode(output_ids, skip_special_tokens=True)
        else:
            self._stream(rec, (), rec.text.close(output_ids), last=True)
            text = rec.text.text
            if rec.text.stopped:  # the whole-output decode can complete a stop string the tokens never showed
                reason = FinishReason.STOP
        if rec.logprobs is None:
            return reason, Sequence(output_ids, text, reason)
        track = tuple(rec.logprobs[: len(output_ids) + (reason is FinishReason.EOS)])
        cum = sum(t.logprob for t in track)
        return reason, Sequence(output_ids, text, reason, cum,
                                score(cum, len(track), rec.request.params.length_penalty), track)

    def nbest(self, request: Request, hypotheses: Seq[Hypothesis]) -> tuple[Sequence, ...]:
        """A beam request's sequences, best first; a stream gets the whole best text now (beams stream nothing
        until the end, as the proto documents)."""
        logprobs = request.params.return_logprobs
        sequences = tuple(self._sequence(h, logprobs) for h in hypotheses)
        best = sequences[0]
        if request.stream:
            self._put(request, tuple(best.token_ids), best.text)
        return sequences

    def _sequence(self, h: Hypothesis, logprobs: bool) -> Sequence:
        eos = h.tokens[-1] == self.eos_id
        ids = list(h.tokens[:-1] if eos else h.tokens)
        track = tuple(TokenLogprob(t, lp, top) for t, lp, top in zip(h.tokens, h.logprobs, h.tops or
                                                                       ((),) * len(h.tokens))) if logprobs else ()
        return Sequence(ids, self.tokenizer.decode(ids, skip_special_tokens=True),
                        FinishReason.EOS if eos else FinishReason.LENGTH, h.cum, h.score, track)

    def _stream(self, rec: Running, ids: tuple[int, ...], piece: str, last: bool = False) -> None:
        """Hands a stream its new ids and text every stream_interval tokens, and the rest at its end."""
        if not rec.request.stream:
            return
        rec.unsent_ids += ids
        rec.unsent_text.append(piece)
        if last or len(rec.unsent_ids) >= self.stream_interval:
            out_ids, out_text = tuple(rec.unsent_ids), "".join(rec.unsent_text)
            rec.unsent_ids, rec.unsent_text = [], []
            self._put(rec.request, out_ids, out_text)

    def _put(self, request: Request, ids: tuple[int, ...], text: str) -> None:
        if text or ids:  # nothing is sent for an empty piece
            self.pending.append(Output(request.id, ids, text))

    def take(self, ended: Iterable[Request], stats: Stats) -> tuple[Output, ...]:
        """Once per step: its stream pieces, then the last Output (with its Result) of every request that ended in it;
        each end is counted once."""
        out, self.pending = self.pending, []
        for r in ended:
            stats.finished.append(r.finish_reason.value)
            out.append(Output(r.id, result=r.result))
        return tuple(out)
