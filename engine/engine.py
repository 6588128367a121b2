"""The engine: one background thread runs step() = schedule -> prepare -> run -> update -> emit, forever.

Requests join and leave the running batch between any two steps. onnxruntime runs in this thread (it releases the
GIL), so the gRPC event loop is never blocked by inference. Every per-request phase runs each request inside `_each`:
a failure ends the requests that cause it and no other (engine/stepping.py lists what each failure ends).
"""
from __future__ import annotations

import collections
import logging
import time

import numpy as np
from tokenizers import Tokenizer

from seqserve.contract.scoring import score
from seqserve.engine import finish
from seqserve.engine.beam import BeamResult, Beams
from seqserve.engine.constraints import Constraints
from seqserve.engine.detokenizer import TextStream
from seqserve.engine.request import FinishReason, Request
from seqserve.engine.rule import Rows
from seqserve.engine.runner import Runner
from seqserve.engine.running import Running, views
from seqserve.engine.sampling import log_softmax, sample_row
from seqserve.engine.scheduler import Plan, Scheduler
from seqserve.engine.step_output import Need, StepOutput
from seqserve.engine.stepping import Stepping

log = logging.getLogger(__name__)


class Engine(Stepping):
    def __init__(self, runner: Runner, tokenizer: Tokenizer, scheduler: Scheduler, stream_interval: int = 1):
        super().__init__(runner, scheduler)
        self.tokenizer = tokenizer
        self.stream_interval = stream_interval  # a stream's message carries this many tokens (the last one fewer)
        special = runner.manifest.special_tokens
        self.eos_id = special["eos_id"]
        self.constraints = Constraints.from_generation(  # the model's token rules; a target language per row
            runner.manifest.generation, per_row_first=bool(runner.manifest.languages))
        self.banned = self.constraints.never_sampled(special)  # never sampled
        self.rules = self.constraints.rules(special)  # engine/token_rules.py: every row's token rules, in order
        self._running: dict[Request, Running] = {}  # every running greedy or sampled request's record
        self._views: tuple[list[Running], ...] | None = None  # running.views: None when a record joined or left
        self.beams = Beams(runner, lambda ids: tokenizer.decode(ids, skip_special_tokens=True), self.eos_id,
                           self.rules)

    def submit(self, request: Request) -> None:
        """Queues a request (raises QueueFull when the waiting queue is at its limit) and wakes the loop."""
        self.scheduler.add(request)
        with self._wake:
            self._wake.notify()

    def generate(self, requests: list[Request]) -> list[Request]:
        """Offline: runs every request to its end in the calling thread (warm-up, verify, quality, bench)."""
        pending = collections.deque(requests)
        while pending or self.scheduler.has_work():
            while pending and self.scheduler.n_waiting < self.scheduler.cfg.max_waiting:
                self.submit(pending.popleft())
            self.step()
        return requests

    def step(self) -> None:
        plan = self.scheduler.schedule(time.monotonic(), self._ended)
        self._ended = []
        self._prepare(plan)
        if self.runner.slots.n_live:
            out = self._run(self._need())
            if out is not None:
                self._update(out, time.monotonic())
        self._emit(plan)

    def _prepare(self, plan: Plan) -> None:
        """Frees the rows that left, runs the encoder (admitted rows without K/V, and some ahead), places rows."""
        self.runner.retire(plan.retired)
        for r in plan.retired:
            self._forget(r)
        if plan.encode:
            self._encode(plan.encode)
        admitted = [r for r in plan.admitted if not r.done]
        self.runner.admit(admitted)
        self._each(admitted, self._join)
        self._fresh = [r for r in admitted if not r.done]  # their first token comes from this step

    def _join(self, r: Request) -> None:
        """A request placed in the batch: a beam request joins the beam component, any other gets its record."""
        if r.n_rows > 1:
            self.beams.admit([r])
            return
        p, self._views = r.params, None
        self._running[r] = Running(r, TextStream(self.tokenizer, p.stop) if r.stream or p.stop else None,
                                   logprobs=[] if p.return_logprobs else None)

    def _forget(self, r: Request) -> None:
        if self._running.pop(r, None) is not None:
            self._views = None
        self.beams.drop(r)

    def _need(self) -> Need:
        """What this step's rows need from the decoder (step_output.py): ids when every row is greedy and no token
        rule acts on them, the top-k when beam requests run and no rule acts, else the logits (the host path)."""
        if not self.runner.token_choice:
            return Need.LOGITS
        if self._views is None:
            self._views = views(self._running.values())
        sampled, scored = self._views[:2]
        slots, hi = self.runner.slots, self.runner.slots.hi
        if sampled or scored or self.rules.need_logits(Rows.of(slots, hi), slots.live[:hi]):
            return Need.LOGITS
        if not self.beams.owns().any():
            return Need.IDS
        return Need.LOGITS if self.beams.needs_logits() else Need.TOP

    def _update(self, out: StepOutput, now: float) -> None:
        """Chooses every row's token, appends it, and ends the rows a finish rule says are done."""
        slots, hi = self.runner.slots, self.runner.slots.hi
        if self._views is None:
            self._views = views(self._running.values())
        sampled, scored, texted, tracked = self._views
        logits = out.logits
        for rec in tracked:  # the records this step reads by row (plain greedy rows cost nothing here)
            rec.slot = slots.slot_of(rec.request)
        single = slots.live[:hi] & ~self.beams.owns()  # (hi,) rows whose token is chosen here (beams: below)
        if logits is None:  # _need saw no row whose choice reads the logits: the graph's argmax is the token
            chosen = out.ids.copy()
        else:
            lps = {rec: log_softmax(logits[rec.slot]) for rec in scored}  # the model's, before anything masks them
            # greedy rows: the token rules on their logits (sampled rows: on a float64 copy in _sample; beams: on
            # their log-probabilities)
            self.rules.apply(logits[:hi], Rows.of(slots, hi), single & ~slots.sampled[:hi])
            chosen = logits.argmax(axis=-1)  # (hi,) one vectorised argmax serves every greedy row
        if sampled:  # (each phase is skipped outright when no row needs it: batch 1 pays per call)
            self._each(sampled, lambda rec: self._sample(rec, logits, chosen))
        codes = np.where(single, finish.after_token(chosen, slots.length[:hi], slots.max_new[:hi], self.eos_id), 0)
        if scored:
            self._each(scored, lambda rec: rec.add_logprob(int(chosen[rec.slot]), lps[rec]))
        appended = single & (codes != finish.EOS)  # (hi,) EOS ends a row without being returned
        slots.append(chosen, appended)
        self._first_tokens(now)
        if texted:
            self._each(texted, lambda rec: self._text(rec, int(chosen[rec.slot]), appended, codes))
        ended = [rec.at(s) for s in np.flatnonzero(codes).tolist()  # (a request that failed this step has left)
                 if (rec := self._running.get(slots.requests[s])) is not None]
        if ended:
            self._each(ended, lambda rec: self._end(rec, finish.REASONS[int(codes[rec.slot])], now))
        generated = int(appended.sum()) + self._advance_beams(out, now)
        self.stats.generated_tokens += generated  # EOS is not returned, so not counted: equals usage
        self._tick(now)

    def _sample(self, rec: Running, logits: np.ndarray, chosen: np.ndarray) -> None:
        s, slots = rec.slot, self.runner.slots
        chosen[s] = sample_row(logits[s], rec, slots.ids[s, 1 : 1 + slots.length[s]], self.eos_id, self.banned,
                               self.rules)

    def _text(self, rec: Running, token: int, appended: np.ndarray, codes: np.ndarray) -> None:
        """A row's new token in its text (a stop string ends it STOP) and its stream."""
        if appended[rec.slot]:
            piece = rec.text.push(token)
            if rec.text.stopped:
                codes[rec.slot] = finish.STOP
            self._stream(rec, (token,), piece)

    def _advance_beams(self, out: StepOutput, now: float) -> int:
        """Every beam request takes its step (engine/beam.py: one vector step for them all, so a failure there is no
        one request's and ends them all); those that ended get their result. Returns their tokens (usage)."""
        try:
            ended = self.beams.advance(out.logits if out.logits is not None else out, now)
        except Exception:
            log.exception("beam step failed; ending the beam requests")
            self._fail(np.flatnonzero(self.beams.owns()).tolist())
            return 0
        self._each(ended, lambda b: self._end_beams(b, now))
        return sum(b.generated for b in ended)

    def _end_beams(self, b: BeamResult, now: float) -> None:
        r, best = b.request, b.sequences[0]
        if r.stream:  # beams stream nothing until the end, then the whole best text (the proto documents this)
            r.emit(tuple(best.token_ids), best.text)
        self._ended_by_engine(r, b.finish_reason, now, sequences=b.sequences, generated=b.generated)

    def _stream(self, rec: Running, ids: tuple[int, ...], piece: str, last: bool = False) -> None:
        """Hands a stream its new ids and text every stream_interval tokens, and the rest at its end."""
        if rec.request.stream and (out := rec.take_unsent(ids, piece, self.stream_interval, last)) is not None:
            rec.request.emit(tuple(out[0]), out[1])
            self._sinks.add(rec.request.sink)

    def _end(self, rec: Running, reason: FinishReason, now: float) -> None:
        """The row's result: its ids, its text (decoded whole once; a stop string in it ends it STOP), its score."""
        r, output_ids = rec.request, self.runner.slots.output(rec.slot)
        if rec.text is None:
            text = self.tokenizer.decode(output_ids, skip_special_tokens=True)
        else:
            self._stream(rec, (), rec.text.close(output_ids), last=True)
            text = rec.text.text
            if rec.text.stopped:  # the whole-output decode can complete a stop string the tokens never showed
                reason = FinishReason.STOP
        sequence = rec.sequence(output_ids, text, reason, score)
        self._ended_by_engine(r, reason, now, sequences=(sequence,), generated=len(output_ids))
