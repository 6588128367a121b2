"""Every running beam request's rows, advanced one decoder step at a time as vector operations over all of them.

A beam request holds num_beams rows of the running batch; each row that holds a live beam knows its request and its
rank. The rules are Hugging Face's, exactly as model/beam.py (the PyTorch reference, which documents each one with
its source) implements them; this is the same algorithm on numpy arrays, so the server needs no torch:
  * candidates = every live beam x every token by cumulative log-probability; the best 2 x num_beams are kept;
  * a candidate ending with the end token, or reaching max_new_tokens, becomes a finished hypothesis only if it
    ranks among the first num_beams; the next live beams are the num_beams best candidates that did not stop;
  * score = contract/scoring.py's, n = generated tokens including the end token;
  * done when no beam is live, or num_beams hypotheses are finished and early_stopping is set or no live beam can
    beat the worst of them (HF's heuristic at the current length).
Ties go to the lower (beam rank, token) index, sums are float64.

One step for all beam requests at once: one log-softmax normaliser and one argpartition over the stacked (rows, V)
live beams (a beam's own 2 x num_beams best tokens hold every candidate its request can keep), then one stable sort
of each request's (num_beams x 2 num_beams) candidates. A new beam stays in its parent's row when it is the parent's
first child; only a parent's further children are copied into rows whose beam had none, so the in-place KV cache
copies a few rows' written columns per step instead of every row's buffers. Python loops run only per finished
hypothesis, per ended request and per row that asks for top_logprobs alternatives.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from seqserve.contract.scoring import score
from seqserve.server.request import FinishReason, Request, Sequence, TokenLogprob
from seqserve.server.runner import Runner

CANDIDATES_PER_BEAM = 2  # HF keeps 2 x num_beams candidates (one end token)


@dataclass(frozen=True)
class BeamResult:
    """A beam request that ended: the engine turns it into the request's final result."""

    request: Request
    sequences: tuple[Sequence, ...]  # the n-best, best first
    finish_reason: FinishReason  # the best sequence's
    generated: int  # tokens counted as usage (the best sequence's length)


@dataclass(frozen=True)
class _Hypothesis:
    tokens: tuple[int, ...]  # as scored: the end token last on EOS
    logprobs: tuple[float, ...]  # each token's log-probability under the model
    tops: tuple[tuple[tuple[int, float], ...], ...]  # per token, the top_logprobs alternatives (id, logprob)
    cum: float
    score: float


@dataclass
class _Search:
    request: Request
    finished: list[_Hypothesis] = field(default_factory=list)  # best first, at most num_beams


class Beams:
    """Every running beam request's rows: admission, the log-probabilities they need, selection, reorder, ending and
    scores, as vector operations over all beam requests in the batch."""

    def __init__(self, runner: Runner, detokenize: Callable[[list[int]], str], eos_id: int) -> None:
        self.runner, self.detokenize, self.eos_id = runner, detokenize, eos_id
        slots = runner.slots
        capacity, max_new = slots.capacity, slots.ids.shape[1] - 1
        # Per-row state (C, ...): the slot map moves it with its row and clears it when the row is freed.
        self._owner = np.zeros(capacity, np.int64)  # the id of the beam request holding the row; 0 = none
        self._beam = np.zeros(capacity, np.int64)  # 1 + the rank of the live beam the row holds; 0 = none
        self._width = np.zeros(capacity, np.int64)  # the request's num_beams
        self._penalty = np.zeros(capacity, np.float64)  # its length_penalty
        self._early = np.zeros(capacity, bool)  # its early_stopping
        self._top_n = np.zeros(capacity, np.int64)  # its top_logprobs
        self._cum = np.zeros(capacity, np.float64)  # the beam's cumulative log-probability
        self._logprob = np.zeros((capacity, max_new), np.float64)  # (C, T) each generated token's log-probability
        self._tops = np.full(capacity, None, object)  # per token, the alternatives (only with top_logprobs)
        self._n_finished = np.zeros(capacity, np.int64)  # live rows: the request's finished hypotheses
        self._worst = np.zeros(capacity, np.float64)  # and the worst one's score
        slots.track(self._owner, self._beam, self._width, self._penalty, self._early, self._top_n, self._cum,
                    self._logprob, self._tops, self._n_finished, self._worst)
        self._searches: dict[int, _Search] = {}  # request id -> its finished hypotheses

    def admit(self, requests: list[Request]) -> None:
        """Requests with n_rows > 1 that the runner has just admitted (their rows are placed): one live beam each."""
        for r in requests:
            rows, p = self.runner.slots.slots_of(r), r.params
            self._owner[rows], self._beam[rows], self._beam[rows[0]] = r.id, 0, 1
            self._width[rows], self._penalty[rows], self._early[rows] = p.num_beams, p.length_penalty, p.early_stopping
            self._top_n[rows], self._cum[rows], self._n_finished[rows] = p.top_logprobs, 0.0, 0
            for row in rows:
                self._tops[row] = ()
            self._searches[r.id] = _Search(r)

    def owns(self) -> np.ndarray:
        """(hi,) bool: the rows whose token this component chooses (the engine skips them)."""
        return self._owner[: self.runner.slots.hi] != 0

    def drop(self, request: Request) -> None:
        """A beam request left for another reason (cancel, deadline, error): forget it."""
        if self._searches.pop(request.id, None) is not None:
            mine = self._owner == request.id  # (C,) its rows, if still placed
            self._owner[mine], self._beam[mine] = 0, 0

    def advance(self, logits: np.ndarray, now: float) -> list[BeamResult]:
        """One step for every beam request: select, reorder the caches by index, append the chosen tokens.
        Returns the beam requests that ended this step (their rows are still placed; the engine retires them)."""
        slots, eos = self.runner.slots, self.eos_id
        beam = self._beam[: slots.hi]
        rows = np.flatnonzero(beam)  # (R,) every live beam of every beam request
        if not rows.size:
            return []
        rows = rows[np.lexsort((beam[rows], self._owner[rows]))]  # by request, then rank
        owners, first, group = np.unique(self._owner[rows], return_index=True, return_inverse=True)  # (Q,) (Q,) (R,)
        rank, lead = beam[rows] - 1, rows[first]  # (R,) and each request's best live row (Q,)
        width, length, penalty = self._width[lead], slots.length[lead], self._penalty[lead]  # (Q,)
        n_fin, worst = self._n_finished[lead], self._worst[lead]  # (Q,)
        n_req, most = len(owners), int(width.max())

        x = logits[rows].astype(np.float64)  # (R, V) the same operations as sampling.log_softmax
        x -= x.max(axis=1, keepdims=True)
        log_z = np.log(np.exp(x).sum(axis=1))  # (R,) the model's distribution, before min_new_tokens
        tops = {i: top_alternatives(x[i] - log_z[i], int(self._top_n[rows[i]]))
                for i in np.flatnonzero(self._top_n[rows]).tolist()}
        x[length[group] < slots.min_new[rows], eos] = -np.inf  # HF masks the end token after log_softmax
        idx = _top_tokens(x, CANDIDATES_PER_BEAM * most)  # (R, k) each beam's best tokens, ascending ids
        k = idx.shape[1]
        lp = np.take_along_axis(x, idx, axis=1) - log_z[:, None]  # (R, k)

        cand = np.full((n_req, most, k), -np.inf)  # (Q, B, k) cumulative log-probability of each candidate
        cand[group, rank] = self._cum[rows][:, None] + lp
        token, logprob, parent = np.zeros((n_req, most, k), np.int64), np.zeros((n_req, most, k)), np.zeros(
            (n_req, most), np.int64)
        token[group, rank], logprob[group, rank], parent[group, rank] = idx, lp, np.arange(rows.size)
        cand, token, logprob = cand.reshape(n_req, -1), token.reshape(n_req, -1), logprob.reshape(n_req, -1)
        order = np.argsort(-cand, axis=1, kind="stable")[:, : CANDIDATES_PER_BEAM * most]  # ties: lower (rank, id)
        total, token = np.take_along_axis(cand, order, 1), np.take_along_axis(token, order, 1)  # (Q, 2B)
        logprob, src = np.take_along_axis(logprob, order, 1), np.take_along_axis(parent, order // k, 1)  # src: in R

        col = np.arange(order.shape[1])
        valid = np.isfinite(total) & (col < CANDIDATES_PER_BEAM * width[:, None])
        stop = (token == eos) | (length + 1 >= slots.max_new[lead])[:, None]  # (Q, 2B)
        finished = valid & stop & (col < width[:, None])  # HF: a stop outside the top num_beams is dropped
        running = valid & ~stop
        new_rank = np.cumsum(running, axis=1) - 1
        running &= new_rank < width[:, None]

        self._finish(finished, owners, rows, src, token, logprob, total, length, penalty, tops, n_fin, worst)
        best = np.take_along_axis(total, running.argmax(axis=1)[:, None], 1)[:, 0]  # (Q,) the best live beam's
        done = ~running.any(axis=1) | ((n_fin == width) & (self._early[lead] | (score(best, length + 1, penalty)
                                                                              <= worst)))
        self._beam[rows] = 0  # the new live beams take their ranks below
        q, c = np.nonzero(running & ~done[:, None])  # (N,) the new live beams, by request then rank
        self._extend(rows[src[q, c]], owners[q], token[q, c], logprob[q, c], total[q, c], new_rank[q, c],
                     length[q], n_fin[q], worst[q], [tops.get(i) for i in src[q, c].tolist()] if tops else None)
        return [self._result(self._searches.pop(int(owners[i]))) for i in np.flatnonzero(done).tolist()]

    def _finish(self, finished, owners, rows, src, token, logprob, total, length, penalty, tops, n_fin, worst):
        """Candidates that stopped among the first num_beams become hypotheses; n_fin and worst (Q,) follow."""
        q_all, c_all = np.nonzero(finished)  # by request, then rank
        if not q_all.size:
            return
        scores = score(total[q_all, c_all], length[q_all] + 1, penalty[q_all]).tolist()  # n counts the end token
        new: dict[int, list[_Hypothesis]] = {}
        for j, (q, c) in enumerate(zip(q_all.tolist(), c_all.tolist())):
            i, n = int(src[q, c]), int(length[q])
            row = rows[i]
            tops_row = self._tops[row] + (tops[i],) if i in tops else ()
            new.setdefault(q, []).append(_Hypothesis(
                tuple(self.runner.slots.ids[row, 1 : 1 + n].tolist()) + (int(token[q, c]),),
                tuple(self._logprob[row, :n].tolist()) + (float(logprob[q, c]),), tops_row, float(total[q, c]),
                scores[j]))
        for q, hyps in new.items():
            search = self._searches[int(owners[q])]
            keep = search.request.params.num_beams
            search.finished = sorted(search.finished + hyps, key=lambda h: -h.score)[:keep]  # stable: older first
            n_fin[q], worst[q] = len(search.finished), search.finished[-1].score

    def _extend(self, src, owner, token, logprob, total, rank, length, n_fin, worst, tops) -> None:
        """The new live beams (N,): the first child of each parent stays in its row, the others are copied into the
        rows of their request that hold no new beam; then every new beam's token is appended."""
        if not src.size:
            return
        slots = self.runner.slots
        _, first = np.unique(src, return_index=True)
        moves = np.ones(src.size, bool)
        moves[first] = False
        dst = src.copy()
        if moves.any():
            mine = np.flatnonzero(np.isin(self._owner[: slots.hi], owner))  # every row of the continuing requests
            kept = np.zeros(slots.hi, bool)
            kept[src[~moves]] = True
            free = mine[~kept[mine]]
            free = free[np.argsort(self._owner[free], kind="stable")]  # by request
            mover = owner[moves]  # ascending: the new beams come by request
            nth = np.arange(mover.size) - np.searchsorted(mover, mover)  # each mover's index among its request's
            dst[moves] = free[np.searchsorted(self._owner[free], mover) + nth]
            self.runner.reorder(dst[moves], src[moves])  # tokens and self K/V; all read before any is written
            for a in (self._logprob, self._tops):
                a[dst[moves]] = a[src[moves]]
        self._beam[dst], self._cum[dst] = rank + 1, total
        self._logprob[dst, length] = logprob
        self._n_finished[dst], self._worst[dst] = n_fin, worst
        for j in np.flatnonzero(self._top_n[dst]).tolist() if tops is not None else ():
            self._tops[dst[j]] = self._tops[dst[j]] + (tops[j],)
        chosen = np.zeros(slots.hi, np.int64)
        chosen[dst] = token
        appended = np.zeros(slots.hi, bool)
        appended[dst] = True
        slots.append(chosen, appended)

    def _result(self, search: _Search) -> BeamResult:
        r = search.request
        sequences = tuple(self._sequence(h, r.params.return_logprobs)
                          for h in search.finished[: r.params.num_return_sequences])
        return BeamResult(r, sequences, sequences[0].finish_reason, len(sequences[0].token_ids))

    def _sequence(self, h: _Hypothesis, logprobs: bool) -> Sequence:
        eos = h.tokens[-1] == self.eos_id
        ids = list(h.tokens[:-1] if eos else h.tokens)
        track = tuple(TokenLogprob(t, lp, top) for t, lp, top in zip(h.tokens, h.logprobs, h.tops or
                                                                       ((),) * len(h.tokens))) if logprobs else ()
        return Sequence(ids, self.detokenize(ids), FinishReason.EOS if eos else FinishReason.LENGTH, h.cum, h.score,
                        track)


def _top_tokens(x: np.ndarray, k: int) -> np.ndarray:
    """(R, V) -> (R, k) each row's k largest, ties to the lower id, as ascending ids (one argpartition for all rows;
    a row with ties at its k-th value is resolved exactly on its own)."""
    vocab = x.shape[1]
    if k >= vocab:
        return np.broadcast_to(np.arange(vocab), x.shape).copy()
    idx = np.argpartition(x, vocab - k, axis=1)[:, vocab - k :]  # (R, k) unordered; [:, 0] holds the k-th largest
    kth = np.take_along_axis(x, idx[:, :1], axis=1)  # (R, 1)
    for i in np.flatnonzero(np.count_nonzero(x >= kth, axis=1) > k).tolist():
        idx[i] = _best(x[i], k)
    idx.sort(axis=1)
    return idx


def _best(values: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest values, best first, ties to the lower index: a stable sort of only the values at or
    above the k-th largest (a full sort of the vocabulary every step would cost more than the selection)."""
    if k <= 0:
        return np.zeros(0, np.int64)
    if k < values.size:
        kth = np.partition(values, values.size - k)[values.size - k]
        candidates = np.flatnonzero(values >= kth)  # ascending: ties keep the lower index first in a stable sort
    else:
        candidates = np.arange(values.size)
    return candidates[np.argsort(-values[candidates], kind="stable")][:k]


def top_alternatives(logprobs: np.ndarray, n: int) -> tuple[tuple[int, float], ...]:
    """The n most likely (token, logprob) of one step, the most likely first (ties: the lower id)."""
    if not n:
        return ()
    return tuple((int(t), float(logprobs[t])) for t in _best(logprobs, n))
