"""Beam search's n-best bookkeeping: each beam request's finished hypotheses, best first, and what an ended one hands
back (engine/step/outputs.py turns hypotheses into sequences)."""
from __future__ import annotations

from dataclasses import dataclass, field

from seqserve.contract.scoring import score
from seqserve.engine.request import FinishReason, Request


@dataclass(frozen=True)
class Hypothesis:
    tokens: tuple[int, ...]  # as scored: the end token last on EOS
    logprobs: tuple[float, ...]  # each token's log-probability under the model
    tops: tuple[tuple[tuple[int, float], ...], ...]  # per token, the top_logprobs alternatives (id, logprob)
    cum: float
    score: float


@dataclass(frozen=True)
class BeamResult:
    """A beam request that ended: outputs.py turns its hypotheses into the request's sequences."""

    request: Request
    hypotheses: tuple[Hypothesis, ...]  # the num_return_sequences best, best first
    finish_reason: FinishReason  # the best one's
    generated: int  # tokens counted as usage (the best sequence's length, the end token excluded)


@dataclass
class _Search:
    request: Request
    finished: list[Hypothesis] = field(default_factory=list)  # best first, at most num_beams


class NBest:
    """The finished hypotheses of every running beam request, by request id."""

    def __init__(self, eos_id: int) -> None:
        self.eos_id = eos_id
        self._searches: dict[int, _Search] = {}

    def add(self, request: Request) -> None:
        self._searches[request.id] = _Search(request)

    def drop(self, request_id: int) -> Request | None:
        """Forgets a request; returns it if it was running here."""
        search = self._searches.pop(request_id, None)
        return None if search is None else search.request

    def finish(self, c, rows, owners, length, penalty, tops, n_fin, worst, ids, logprob, tops_by_row) -> None:
        """Candidates c (beam._Candidates) that stopped among the first num_beams become hypotheses; n_fin and worst
        (Q,) follow. ids (C, 1+T), logprob (C, T) and tops_by_row (C,) are each row's tokens and their scores."""
        scores = score(c.total, length[c.group] + 1, penalty[c.group]).tolist()  # n counts the end token
        new: dict[int, list[Hypothesis]] = {}
        for j, (i, q) in enumerate(zip(c.parent.tolist(), c.group.tolist())):
            row, n = rows[i], int(length[q])
            tops_row = tops_by_row[row] + (tops[i],) if i in tops else ()
            new.setdefault(q, []).append(Hypothesis(
                tuple(ids[row, 1 : 1 + n].tolist()) + (int(c.token[j]),),
                tuple(logprob[row, :n].tolist()) + (float(c.logprob[j]),), tops_row, float(c.total[j]), scores[j]))
        for q, hyps in new.items():
            search = self._searches[int(owners[q])]
            keep = search.request.params.num_beams
            search.finished = sorted(search.finished + hyps, key=lambda h: -h.score)[:keep]  # stable: older first
            n_fin[q], worst[q] = len(search.finished), search.finished[-1].score

    def result(self, request_id: int) -> BeamResult:
        """An ended request's num_return_sequences best; it is forgotten here."""
        search = self._searches.pop(request_id)
        best = search.finished[: search.request.params.num_return_sequences]
        eos = best[0].tokens[-1] == self.eos_id
        return BeamResult(search.request, tuple(best), FinishReason.EOS if eos else FinishReason.LENGTH,
                          len(best[0].tokens) - eos)
