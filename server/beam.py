"""One request's beam search, advanced one decoder step at a time; its beams are rows of the running batch.

The rules are Hugging Face's, exactly as model/beam.py (the PyTorch reference, which documents each one with its
source) implements them; this is the same algorithm on numpy arrays, so the server needs no torch:
  * candidates = every live beam x every token by cumulative log-probability; the best 2 x num_beams are kept;
  * a candidate ending with the end token, or reaching max_new_tokens, becomes a finished hypothesis only if it
    ranks among the first num_beams; the next live beams are the num_beams best candidates that did not stop;
  * score = cumulative_logprob / n ** length_penalty, n = generated tokens including the end token;
  * done when no beam is live, or num_beams hypotheses are finished and early_stopping is set or no live beam can
    beat the worst of them (HF's heuristic at the current length).
Ties go to the lower (beam, token) index, sums are float64.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from seqserve.contract.scoring import score
from seqserve.server.request import FinishReason, Request, SamplingParams, Sequence, TokenLogprob
from seqserve.server.runner import Runner
from seqserve.server.sampling import log_softmax

CANDIDATES_PER_BEAM = 2  # HF keeps 2 x num_beams candidates (one end token)


@dataclass(frozen=True)
class Beam:
    tokens: tuple[int, ...]
    logprobs: tuple[float, ...]  # each token's log-probability under the model
    tops: tuple[tuple[tuple[int, float], ...], ...]  # per token, the top_logprobs alternatives (id, logprob)
    cum: float


@dataclass(frozen=True)
class Hypothesis:
    token_ids: list[int]  # without the end token
    finish_reason: FinishReason  # EOS or LENGTH
    cumulative_logprob: float
    score: float
    beam: Beam  # its tokens with their log-probabilities (the end token's last on EOS)


@dataclass(frozen=True)
class BeamResult:
    """A beam request that ended: the engine turns it into the request's final result."""

    request: Request
    sequences: tuple[Sequence, ...]  # the n-best, best first
    finish_reason: FinishReason  # the best sequence's
    generated: int  # tokens counted as usage (the best sequence's length)


class Beams:
    """Every running beam request's rows: admission, the log-probabilities they need, selection, reorder, ending and
    scores."""

    def __init__(self, runner: Runner, detokenize: Callable[[list[int]], str], eos_id: int) -> None:
        self.runner, self.detokenize, self.eos_id = runner, detokenize, eos_id
        self._searches: dict[Request, BeamSearch] = {}

    def admit(self, requests: list[Request]) -> None:
        """Requests with n_rows > 1 that the runner has just admitted (their rows are placed)."""
        for r in requests:
            self._searches[r] = BeamSearch(r.params, self.eos_id)

    def owns(self) -> np.ndarray:
        """(hi,) bool: the rows whose token this component chooses (the engine skips them)."""
        slots = self.runner.slots
        owned = np.zeros(slots.hi, bool)
        for r in self._searches:
            owned[slots.slots_of(r)] = True
        return owned

    def advance(self, logits: np.ndarray, now: float) -> list[BeamResult]:
        """One step for every beam request: select, reorder the caches, append the chosen tokens. Returns the beam
        requests that ended this step (their rows are still placed; the engine retires them)."""
        slots, ended = self.runner.slots, []
        for r, search in list(self._searches.items()):
            rows = slots.slots_of(r)
            live = rows[: len(search.live)]
            parents, tokens = search.advance(log_softmax(logits[live]))  # the model's, before min_new_tokens
            if search.done:
                ended.append(self._result(r, search))
                del self._searches[r]
                continue
            dst = rows[: len(parents)]
            self.runner.reorder(dst, [live[p] for p in parents])  # each new beam continues its parent's cache
            chosen = np.zeros(slots.hi, np.int64)
            chosen[dst] = tokens
            mask = np.zeros(slots.hi, bool)
            mask[dst] = True
            slots.append(chosen, mask)
        return ended

    def drop(self, request: Request) -> None:
        """A beam request left for another reason (cancel, deadline, error): forget it."""
        self._searches.pop(request, None)

    def _result(self, r: Request, search: BeamSearch) -> BeamResult:
        sequences = tuple(Sequence(h.token_ids, self.detokenize(h.token_ids), h.finish_reason, h.cumulative_logprob,
                                   h.score, _logprobs(h.beam) if r.params.return_logprobs else ())
                          for h in search.results())
        best = sequences[0]
        return BeamResult(r, sequences, best.finish_reason, len(best.token_ids))


class BeamSearch:
    def __init__(self, params: SamplingParams, eos_id: int) -> None:
        self.p, self.eos_id = params, eos_id
        self.live = [Beam((), (), (), 0.0)]  # one real beam at the start (model/beam.py explains why)
        self.finished: list[Hypothesis] = []  # best first, at most num_beams
        self.done = False

    def advance(self, logprobs: np.ndarray) -> tuple[list[int], list[int]]:
        """logprobs (n_live, V) float64: each live beam's log_softmax. Returns (parent row, token) of each new live
        beam, in order (empty once done)."""
        p, length = self.p, len(self.live[0].tokens) + 1  # the candidates' length
        masked = logprobs.copy()
        if length - 1 < p.min_new_tokens:
            masked[:, self.eos_id] = -np.inf
        cum = np.array([b.cum for b in self.live])  # (N,)
        total = (cum[:, None] + masked).ravel()  # (N * V,)
        keep = min(CANDIDATES_PER_BEAM * p.num_beams, int(np.isfinite(total).sum()))
        order = _best(total, keep)
        vocab = logprobs.shape[1]
        parents, tokens, running, new = [], [], [], []
        for rank, flat in enumerate(order.tolist()):
            row, token = divmod(flat, vocab)
            beam = self._extend(self.live[row], token, logprobs[row], float(total[flat]))
            if token == self.eos_id or length >= p.max_new_tokens:
                if rank < p.num_beams:  # HF: a stop outside the top num_beams is dropped
                    new.append(self._hypothesis(beam))
            elif len(running) < p.num_beams:
                running.append(beam)
                parents.append(row)
                tokens.append(token)
        self.finished = sorted(self.finished + new, key=lambda h: -h.score)[: p.num_beams]  # stable: older first
        self.live = running
        self.done = not running or (len(self.finished) == p.num_beams and (
            p.early_stopping or score(running[0].cum, length, p.length_penalty) <= self.finished[-1].score))
        return ([], []) if self.done else (parents, tokens)

    def results(self) -> list[Hypothesis]:
        return self.finished[: self.p.num_return_sequences]

    def _extend(self, beam: Beam, token: int, logprobs: np.ndarray, cum: float) -> Beam:
        top = top_alternatives(logprobs, self.p.top_logprobs)
        return Beam(beam.tokens + (token,), beam.logprobs + (float(logprobs[token]),), beam.tops + (top,), cum)

    def _hypothesis(self, beam: Beam) -> Hypothesis:
        eos = beam.tokens[-1] == self.eos_id
        return Hypothesis(list(beam.tokens[:-1] if eos else beam.tokens), FinishReason.EOS if eos else FinishReason.LENGTH,
                          beam.cum, score(beam.cum, len(beam.tokens), self.p.length_penalty), beam)  # n: end token in


def _best(values: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest values, best first, ties to the lower index: a stable sort of only the values at or
    above the k-th largest (a full sort of beams x vocabulary every step cost half of a beam row's time)."""
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


def _logprobs(beam: Beam) -> tuple[TokenLogprob, ...]:
    return tuple(TokenLogprob(t, lp, top) for t, lp, top in zip(beam.tokens, beam.logprobs, beam.tops))
