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

One step for all beam requests at once: one log-softmax normaliser over the stacked (rows, V) live beams and one
search for each beam's own 2 x num_beams best tokens (they hold every candidate its request can keep) among the
vocabulary groups with the largest maxima (top_k.candidates: no whole-vocabulary selection per row), then one stable
lexsort of every candidate by request and cumulative log-probability. A new beam stays in its parent's row when it
is the parent's first child; only a parent's further children are copied into rows whose beam had none, so the
in-place KV cache copies a few rows' written columns per step instead of every row's buffers. Python loops run
only per admitted request, per finished hypothesis, per ended request, per row that asks for top_logprobs
alternatives and per row whose k-th and (k + 1)-th best tokens tie exactly.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from seqserve.contract import names
from seqserve.contract.scoring import score
from seqserve.engine.decoding.nbest import BeamResult, NBest
from seqserve.engine.decoding.rule import Rows
from seqserve.engine.decoding.rule_renormalize import log_normaliser
from seqserve.engine.decoding.token_rules import TokenRules
from seqserve.engine.decoding.top_k import best as _best
from seqserve.engine.decoding.top_k import candidates as _candidates
from seqserve.engine.decoding.top_k import top_alternatives
from seqserve.engine.request import Request
from seqserve.engine.runtime.runner import Runner
from seqserve.engine.step_output import StepOutput

CANDIDATES_PER_BEAM = 2  # HF keeps 2 x num_beams candidates (one end token)


@dataclass(frozen=True)
class _Candidates:
    """Kept candidates (M,), by request then rank: each one's parent (an index into the step's live rows), token,
    log-probability, cumulative log-probability and request (an index into the step's requests)."""

    parent: np.ndarray
    token: np.ndarray
    logprob: np.ndarray
    total: np.ndarray
    group: np.ndarray

    def take(self, mask: np.ndarray) -> _Candidates:
        return _Candidates(self.parent[mask], self.token[mask], self.logprob[mask], self.total[mask], self.group[mask])


class Beams:
    """Every running beam request's rows: admission, the log-probabilities they need, selection, reorder, ending and
    scores, as vector operations over all beam requests in the batch."""

    def __init__(self, runner: Runner, eos_id: int, rules: TokenRules | None = None) -> None:
        self.runner, self.eos_id = runner, eos_id
        self.rules = rules or TokenRules.for_request(eos_id)  # engine/decoding/token_rules.py: the model's list
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
        self.nbest = NBest(eos_id)  # each request's finished hypotheses
        self._n_top = 0  # running requests that ask for top_logprobs (their rows cost a loop each)
        # (R, V) float32 scratch, grown to the most beam rows seen: a fresh (R, V) array per step cost more in page
        # faults than the copy itself
        self._scratch = (np.empty((0, 0), np.float32), np.empty((0, 0), np.float32))

    def admit(self, requests: list[Request]) -> None:
        """Requests with n_rows > 1 that the runner has just admitted (their rows are placed): one live beam each."""
        for r in requests:
            rows, p = self.runner.slots.slots_of(r.id), r.params
            self._owner[rows], self._beam[rows], self._beam[rows[0]] = r.id, 0, 1
            self._width[rows], self._penalty[rows], self._early[rows] = p.num_beams, p.length_penalty, p.early_stopping
            self._top_n[rows], self._cum[rows], self._n_finished[rows] = p.top_logprobs, 0.0, 0
            for row in rows:
                self._tops[row] = ()
            self.nbest.add(r)
            self._n_top += bool(p.top_logprobs)

    def _ruled(self, raw: np.ndarray, top: np.ndarray, log_z: np.ndarray, rows: Rows,
               acting: list) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The rows' log-probabilities (R, V) float64 after the token rules, as (raw, top, log_z) with top = log_z =
        0, so the selection below reads them unchanged."""
        lp = np.subtract(raw, top, dtype=np.float64)  # (R, V): forced ids, no renormalize; top_logprobs
        lp -= log_z[:, None]
        self.rules.apply(lp, rows, acting=acting)
        return lp, np.zeros_like(top), np.zeros_like(log_z)

    def owns(self) -> np.ndarray:
        """(hi,) bool: the rows whose token this component chooses (the other deciders skip them)."""
        return self._owner[: self.runner.slots.hi] != 0

    def drop(self, request_id: int) -> None:
        """A beam request left for another reason (cancel, deadline, error): forget it."""
        if (request := self.nbest.drop(request_id)) is not None:
            self._n_top -= bool(request.params.top_logprobs)
            mine = self._owner == request_id  # (C,) its rows, if still placed
            self._owner[mine], self._beam[mine] = 0, 0

    def needs_logits(self) -> bool:
        """Whether this step's beams need the whole logits (top_logprobs, or more candidates than the graph's
        TOP_K) rather than the graph's top-k; the token rules say so themselves (Engine._need asks them)."""
        hi = self.runner.slots.hi
        live = self._beam[:hi] != 0
        return bool(self._n_top or CANDIDATES_PER_BEAM * int(self._width[:hi][live].max(initial=0)) > names.TOP_K)

    def _from_logits(self, logits: np.ndarray, rows: np.ndarray, k: int):
        """(idx (R, k) each beam's best ids, ascending; lp (R, k) their float64 log-probabilities; the top_logprobs
        alternatives by row index, the model's distribution before any rule) from the logits, after the token rules
        (on log-probabilities, as transformers' beam search applies its processors)."""
        narrow, exps = self._buffers(rows.size, logits.shape[1])
        whole = not self._n_top and rows.size == logits.shape[0]  # every row a beam's: the step's own logits, no copy
        # (R, V) float32: rows in slot order (whole; the rules may change the step's logits, which no one reads after
        # the deciders), else a copy in `rows` order
        raw = logits if whole else np.take(logits, rows, axis=0, out=narrow, mode="clip")
        ruled = Rows.of(self.runner.slots, rows.size if whole else rows, logprobs=True)
        acting = self.rules.acting(ruled)
        renormalised = not self._n_top and self.rules.masks_then_renormalize(acting)
        if renormalised:  # log_softmax(masked logits) is renormalize(mask(log_softmax)): one normaliser, no float64
            self.rules.apply(raw, ruled, acting=acting[:-1])
        top32 = raw.max(axis=1, keepdims=True)  # (R, 1)
        top = top32.astype(np.float64)
        log_z = log_normaliser(np.subtract(raw, top32, out=exps), out=exps)[:, 0]  # (R,) as sampling.log_softmax
        tops = {i: top_alternatives(_shifted(raw, top, i) - log_z[i], int(self._top_n[rows[i]]))
                for i in np.flatnonzero(self._top_n[rows]).tolist()} if self._n_top else {}
        if acting and not renormalised:
            if self.rules.masks_only(acting):  # bans alone: on the float32 logits, the same -inf (no float64 copy)
                self.rules.apply(raw, ruled, acting=acting)
            else:
                raw, top, log_z = self._ruled(raw, top, log_z, ruled, acting)
        idx = _top_tokens(raw, top, k)  # (R, k) each beam's best, ascending
        lp = _shifted(raw, top, np.arange(rows.size)[:, None], idx) - log_z[:, None]  # (R, k)
        return (idx[rows], lp[rows], tops) if whole else (idx, lp, tops)

    def _buffers(self, n: int, vocab: int) -> tuple[np.ndarray, np.ndarray]:
        """(n, vocab) float32 views of the two scratch arrays (the rows' logits, their exponentials), which grow when
        n rows do not fit."""
        raw, exps = self._scratch
        if raw.shape[0] < n or raw.shape[1] != vocab:
            self._scratch = raw, exps = np.empty((n, vocab), np.float32), np.empty((n, vocab), np.float32)
        return raw[:n], exps[:n]

    def advance(self, logits: np.ndarray | StepOutput) -> list[BeamResult]:
        """One step for every beam request: select, reorder the caches by index, append the chosen tokens.
        Returns the beam requests that ended this step (their rows are still placed; the engine retires them)."""
        slots, eos = self.runner.slots, self.eos_id
        beam = self._beam[: slots.hi]
        rows = np.flatnonzero(beam)  # (R,) every live beam of every beam request
        if not rows.size:
            return []
        owner = self._owner[rows]
        order = np.lexsort((beam[rows], owner))
        rows, owner = rows[order], owner[order]  # by request, then rank
        head = _heads(owner)  # (R,) a request's best live beam starts its rows
        group, start = np.cumsum(head) - 1, np.flatnonzero(head)  # (R,) request index of each row; (Q,)
        lead, length = rows[start], slots.length[rows]  # (Q,) each request's best live row; (R,) tokens so far
        width = self._width[lead]  # (Q,)

        k = CANDIDATES_PER_BEAM * int(width.max())
        if isinstance(logits, StepOutput):  # the graph's top-k (needs_logits() was False): no token rule applies
            idx, lp, tops = _from_top(logits, rows, k)
        else:
            idx, lp, tops = self._from_logits(logits, rows, k)
        k = idx.shape[1]
        total = (self._cum[rows][:, None] + lp).ravel()  # (R k,) by request, then (rank, token): HF's tie order
        rep = np.repeat(group, k)  # (R k,)
        cand = np.lexsort((-total, rep))  # by request, then best first (stable: ties keep the lower (rank, token))
        g = rep[cand]
        pos = np.arange(cand.size) - start[g] * k  # rank among its request's candidates
        keep = (pos < CANDIDATES_PER_BEAM * width[g]) & (total[cand] > -np.inf)
        cand, g, pos = cand[keep], g[keep], pos[keep]  # (M,) the kept candidates
        c = _Candidates(cand // k, idx.ravel()[cand], lp.ravel()[cand], total[cand], g)
        stop = (c.token == eos) | (length + 1 >= slots.max_new[rows])[c.parent]  # (M,)
        finished = stop & (pos < width[g])  # HF: a stop outside the top num_beams is dropped
        running = ~stop
        first = np.flatnonzero(_heads(g))  # (Q,) every request keeps at least one candidate
        new_rank = np.cumsum(running)
        new_rank -= new_rank[first][g] - running[first][g] + 1
        running &= new_rank < width[g]

        n_fin, worst = self._n_finished[lead], self._worst[lead]  # (Q,)
        penalty = self._penalty[lead]
        if finished.any():
            self.nbest.finish(c.take(finished), rows, self._owner[lead], length[start], penalty, tops, n_fin, worst,
                              slots.ids, self._logprob, self._tops)
        best = np.maximum.reduceat(np.where(running, c.total, -np.inf), first)  # (Q,) the best live beam's
        done = best == -np.inf
        full = n_fin == width
        if full.any():  # HF's heuristic only once num_beams hypotheses are finished
            done |= full & (self._early[lead] | (score(best, length[start] + 1, penalty) <= worst))
        self._beam[rows] = 0  # the new live beams take their ranks below
        going = running & ~done[g]
        if going.all():
            self._extend(c, new_rank, rows, self._owner[lead], length, n_fin, worst, tops)
        elif going.any():
            self._extend(c.take(going), new_rank[going], rows, self._owner[lead], length, n_fin, worst, tops)
        if not done.any():
            return []
        ended = [self.nbest.result(int(o)) for o in self._owner[lead[done]].tolist()]
        self._n_top -= sum(bool(b.request.params.top_logprobs) for b in ended)
        return ended

    def _extend(self, c: _Candidates, rank, rows, owners, length, n_fin, worst, tops) -> None:
        """The new live beams (N,): the first child of each parent stays in its row, the others are copied into the
        rows of their request that hold no new beam; then every new beam's token is appended."""
        slots = self.runner.slots
        src = rows[c.parent]  # (N,) by request, then rank
        nth = np.arange(src.size)
        first = np.full(rows.size, src.size)
        np.minimum.at(first, c.parent, nth)  # each parent's first child
        moves = first[c.parent] != nth  # a parent's later children move
        dst = src.copy()
        if moves.any():
            owner = self._owner[: slots.hi]
            at = np.minimum(np.searchsorted(owners, owner), owners.size - 1)
            kept = (owners[at] == owner) & (self._beam[: slots.hi] == 0)  # rows of these requests with no beam yet
            kept[src[~moves]] = False
            free = np.flatnonzero(kept)
            free = free[np.argsort(owner[free], kind="stable")]  # by request
            mover = c.group[moves]  # ascending: the new beams come by request
            nth = nth[: mover.size] - np.searchsorted(mover, mover)  # each mover's index among its request's
            dst[moves] = free[np.searchsorted(owner[free], owners[mover]) + nth]
            self.runner.reorder(dst[moves], src[moves])  # tokens and self K/V; all read before any is written
            for a in (self._logprob, self._tops):
                a[dst[moves]] = a[src[moves]]
        self._beam[dst], self._cum[dst] = rank + 1, c.total
        self._logprob[dst, length[c.parent]] = c.logprob
        self._n_finished[dst], self._worst[dst] = n_fin[c.group], worst[c.group]
        for j in np.flatnonzero(self._top_n[dst]).tolist() if tops else ():
            self._tops[dst[j]] = self._tops[dst[j]] + (tops[int(c.parent[j])],)
        chosen = np.zeros(slots.hi, np.int64)
        chosen[dst] = c.token
        appended = np.zeros(slots.hi, bool)
        appended[dst] = True
        slots.append(chosen, appended)


def _from_top(out: StepOutput, rows: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, dict]:
    """The graph's TOP_K best ids (best first, ties to the lower id) cut to k and put in ascending id order, as
    _top_tokens gives them, with their log-probabilities in float64."""
    idx, lp = out.top_ids[rows, :k], out.top_logprobs[rows, :k].astype(np.float64)  # (R, k)
    order = np.argsort(idx, axis=1)
    return np.take_along_axis(idx, order, 1), np.take_along_axis(lp, order, 1), {}


def _top_tokens(raw: np.ndarray, top: np.ndarray, k: int) -> np.ndarray:
    """(R, V) float32 -> (R, k) each row's k largest x = raw - top (its float64 log-probabilities up to a constant),
    ties to the lower id, as ascending ids. raw orders a row as x does, or ties where x does not, so the k + 1 best of
    raw are found for all rows at once; a row whose k-th and (k + 1)-th x tie is resolved exactly alone."""
    n, vocab = raw.shape
    if k >= vocab:
        return np.broadcast_to(np.arange(vocab), raw.shape).copy()
    idx = _candidates(raw, k + 1)  # (R, W) ids holding every row's k + 1 best values
    if idx is None:
        idx = np.argpartition(raw, vocab - k - 1, axis=1)[:, vocab - k - 1 :]  # (R, k + 1)
    else:
        part = np.argpartition(np.take_along_axis(raw, idx, 1), idx.shape[1] - k - 1, axis=1)
        idx = np.take_along_axis(idx, part[:, idx.shape[1] - k - 1 :], 1)  # (R, k + 1); [:, 0] is the (k + 1)-th
    best = _shifted(raw, top, np.arange(n)[:, None], idx)  # (R, k + 1)
    idx = idx[:, 1:]
    for i in np.flatnonzero(best[:, 1:].min(axis=1) <= best[:, 0]).tolist():
        idx[i] = _best(_shifted(raw, top, i), k, kth=best[i, 1:].min())  # best[i, 1:]: its k best values
    idx.sort(axis=1)
    return idx


def _shifted(raw: np.ndarray, top: np.ndarray, i, j=slice(None)) -> np.ndarray:
    """raw[i, j] - top[i] in float64: log_softmax's x - max for those entries (as sampling.log_softmax computes)."""
    return raw[i, j].astype(np.float64) - top[i, 0]


def _heads(a: np.ndarray) -> np.ndarray:
    """(n,) bool: where a new value starts in a sorted array."""
    head = np.empty(a.size, bool)
    head[:1] = True
    np.not_equal(a[1:], a[:-1], out=head[1:])
    return head
