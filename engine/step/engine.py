"""The engine: one step = schedule -> execute -> choose tokens -> report, composed of its collaborators.

Requests join and leave the running batch between any two steps. onnxruntime runs in the engine's thread
(engine/step/loop.py; it releases the GIL), so the edge is never blocked by inference. The scheduler decides who runs
(and drains the aborts), the runner executes (engine/step/isolation.py confines a failure to the requests that cause
it),
TokenChoice (engine/step/token_choice.py) asks each kind of row's decider for its tokens, engine/step/outputs.py writes
everything
that goes back, and step() returns it all as one StepReport. A request that ends leaves in one place (_retire).
"""
from __future__ import annotations

import collections
import logging
import time

import numpy as np
from tokenizers import Tokenizer

from seqserve.engine.api import StepReport
from seqserve.engine.decoding.beam import Beams
from seqserve.engine.decoding.nbest import BeamResult
from seqserve.engine.decoding.token_rules import TokenRules
from seqserve.engine.request import FinishReason, Request
from seqserve.engine.runtime.runner import Runner
from seqserve.engine.runtime.slots import Joining
from seqserve.engine.step import finish
from seqserve.engine.step.isolation import Isolation
from seqserve.engine.step.loop import Loop
from seqserve.engine.step.outputs import Outputs, end
from seqserve.engine.step.running import Running, views
from seqserve.engine.step.scheduler import Plan, Scheduler
from seqserve.engine.step.stats import Stats
from seqserve.engine.step.token_choice import TokenChoice
from seqserve.engine.step_output import Need, StepOutput

log = logging.getLogger(__name__)


class Engine:
    def __init__(self, runner: Runner, tokenizer: Tokenizer, scheduler: Scheduler, stream_interval: int = 1):
        self.runner, self.scheduler, self.tokenizer = runner, scheduler, tokenizer
        manifest = runner.manifest
        self.eos_id = manifest.special_tokens["eos_id"]
        self.rules = TokenRules.for_model(  # every row's token rules, in order; a target language per row
            manifest.generation, manifest.special_tokens, per_row_first=bool(manifest.languages))
        self.beams = Beams(runner, self.eos_id, self.rules)
        self.choice = TokenChoice(runner, self.rules, self.beams)
        self.stats = Stats()  # this step's figures, plain numbers: taken into the step's report
        self.outputs = Outputs(tokenizer, self.eos_id, stream_interval)
        self.isolation = Isolation(runner, self.stats, self._end_error, self._retire, lambda slot: self._placed[
            runner.slots.owners[slot]])
        self.loop = Loop(self.step, scheduler.has_work, self._recover, self._drain)
        self._cross: dict[int, object] = {}  # encode-ahead: each encoded source's cross K/V by request id
        self._placed: dict[int, Request] = {}  # requests holding rows, by id (until retired)
        self._running: dict[Request, Running] = {}  # every running greedy or sampled request's record
        self._views: tuple[list[Running], ...] | None = None  # running.views: None when a record joined or left
        self._beaming: set[int] = set()  # running beam requests: a step without any calls no beam code
        self._ended: list[Request] = []  # requests ended this step: retired, and reported, at its end
        self._fresh: list[Request] = []  # requests admitted this step: their first token comes from this step
        self._last_step_at: float | None = None

    # The thread (engine/step/loop.py): tests hold it between steps through after_step.
    def start(self) -> None:
        self.loop.start()

    def stop(self, timeout: float = 10.0) -> bool:
        """Asks the engine to end. The engine thread itself ends whatever is still queued or running as CANCELLED
        (the service drained first), between two steps, so no request is ever ended by two threads. True once that
        is done; False if a step still runs after `timeout` s: the engine then drains itself when that step returns."""
        return self.loop.stop(timeout)

    @property
    def after_step(self):
        return self.loop.after_step

    @after_step.setter
    def after_step(self, hook) -> None:
        self.loop.after_step = hook

    def submit(self, requests: list[Request]) -> None:
        """Queues every request or none (raises QueueFull when they do not fit the waiting queue); wakes the loop."""
        self.scheduler.add(requests)
        self.loop.wake()

    def abort(self, request_id: int, deadline: bool = False) -> None:
        """From any thread: a message the next step's schedule drains (Scheduler.abort); wakes the loop."""
        self.scheduler.abort(request_id, deadline)
        self.loop.wake()

    def generate(self, requests: list[Request]) -> list[Request]:
        """Offline: runs every request to its end in the calling thread (warm-up, verify, quality, bench)."""
        pending = collections.deque(requests)
        while pending or self.scheduler.has_work():
            while pending and self.scheduler.n_waiting < self.scheduler.cfg.max_waiting:
                self.submit([pending.popleft()])
            self.step()
        return requests

    def step(self) -> StepReport:
        """One step: its report holds every Output it made and its figures."""
        plan = self.scheduler.schedule(time.monotonic())
        self._ended += plan.abandoned + plan.dropped
        self._retire(self._ended)  # their rows are free for this step's admissions
        self._place(plan)
        if self.runner.slots.n_live:
            out = self.isolation.run(self._need())
            if out is not None:
                self._update(out, time.monotonic())
        return self._report()

    def _place(self, plan: Plan) -> None:
        """Runs the encoder (admitted rows without K/V, and some ahead) and places the admitted rows."""
        if plan.encode:
            self._encode(plan.encode)
        admitted = [r for r in plan.admitted if not r.done]
        cross = [self._cross.pop(r.id) for r in admitted]
        self.runner.admit(Joining.of(admitted), [c for r, c in zip(admitted, cross) for _ in range(r.n_rows)])
        self._placed.update((r.id, r) for r in admitted)
        self.isolation.each(admitted, self._join)
        self._fresh = [r for r in admitted if not r.done]  # their first token comes from this step

    def _encode(self, requests: list[Request]) -> None:
        cross, failed = self.isolation.encode(requests)
        self._cross.update(cross)
        self.stats.input_tokens += sum(r.n_input_tokens for r in requests if r.id in cross)
        self.scheduler.unencode(failed)
        for r in failed:  # admitted or waiting: either way it ends here and leaves at the step's end
            self._end_error(r)

    def _join(self, r: Request) -> None:
        """A request placed in the batch: a beam request joins the beam component, any other gets its record."""
        if r.n_rows > 1:
            self._beaming.add(r.id)
            self.beams.admit([r])
            return
        self._running[r], self._views = self.outputs.record(r), None

    def _records(self) -> tuple[list[Running], ...]:
        if self._views is None:
            self._views = views(self._running.values())
        return self._views

    def _need(self) -> Need:
        sampled, scored = self._records()[:2]
        return self.choice.need(sampled, scored, bool(self._beaming))

    def _update(self, out: StepOutput, now: float) -> None:
        """Chooses every row's token, appends it, and ends the rows a finish rule says are done."""
        slots, hi, each = self.runner.slots, self.runner.slots.hi, self.isolation.each
        sampled, scored, texted, tracked = self._records()
        for rec in tracked:  # the records this step reads by row (plain greedy rows cost nothing here)
            rec.slot = slots.slot_of(rec.request.id)
        chosen, single, lps = self.choice.choose(out, sampled, scored, each, bool(self._beaming))
        codes = np.where(single, finish.after_token(chosen, slots.length[:hi], slots.max_new[:hi], self.eos_id), 0)
        if scored:
            each(scored, lambda rec: self.outputs.logprob(rec, int(chosen[rec.slot]), lps[rec]))
        appended = single & (codes != finish.EOS)  # (hi,) EOS ends a row without being returned
        slots.append(chosen, appended)
        self._first_tokens(now)
        if texted:  # (python lists: one conversion per step instead of a numpy scalar per row)
            tokens, kept = chosen.tolist(), appended.tolist()

            def text(rec: Running) -> None:  # a row's new token in its text and stream; a stop string ends it STOP
                if kept[rec.slot] and self.outputs.token(rec, tokens[rec.slot]):
                    codes[rec.slot] = finish.STOP

            each(texted, text)
        ended = [rec.at(s) for s in np.flatnonzero(codes).tolist()  # (a request that failed this step has left)
                 if (rec := self._running.get(self._placed.get(slots.owners[s]))) is not None]
        if ended:
            each(ended, lambda rec: self._finish(rec, finish.REASONS[int(codes[rec.slot])], now))
        generated = int(appended.sum()) + (self._advance_beams(out, now) if self._beaming else 0)
        self.stats.generated_tokens += generated  # EOS is not returned, so not counted: equals usage
        self._tick(now)

    def _finish(self, rec: Running, reason: FinishReason, now: float) -> None:
        output_ids = self.runner.slots.output(rec.slot)
        reason, sequence = self.outputs.final(rec, output_ids, reason)
        self._end(rec.request, reason, now, sequences=(sequence,), generated=len(output_ids))

    def _advance_beams(self, out: StepOutput, now: float) -> int:
        """Every beam request takes its step (engine/decoding/beam.py: one vector step for them all, so a failure there
        is no
        one request's and ends them all); those that ended get their result. Returns their tokens (usage)."""
        try:
            ended = self.choice.advance(out)
        except Exception:
            log.exception("beam step failed; ending the beam requests")
            self.isolation.fail(np.flatnonzero(self.beams.owns()).tolist())
            return 0
        self.isolation.each(ended, lambda b: self._end_beams(b, now))
        return sum(b.generated for b in ended)

    def _end_beams(self, b: BeamResult, now: float) -> None:
        sequences = self.outputs.nbest(b.request, b.hypotheses)
        self._end(b.request, b.finish_reason, now, sequences=sequences, generated=b.generated)

    def _end(self, r: Request, reason: FinishReason, now: float, **result) -> None:
        """Ends a request with its result; it is retired, and its last Output reported, at the step's end."""
        if end(r, reason, now, **result):
            self._ended.append(r)

    def _retire(self, requests: list[Request]) -> None:
        """The one place a request that ended leaves: its rows, its cross K/V, its record or beams, and the
        scheduler's books (each part forgets a request once; a second call changes nothing)."""
        self.runner.retire([r.id for r in requests])
        self.scheduler.retire(requests)
        for r in requests:
            self._cross.pop(r.id, None)  # an encoded source that never ran frees its K/V here
            self._placed.pop(r.id, None)
            if self._running.pop(r, None) is not None:
                self._views = None
            elif r.id in self._beaming:
                self._beaming.discard(r.id)
                self.beams.drop(r.id)

    def _end_error(self, r: Request) -> None:
        self._end(r, FinishReason.ERROR, time.monotonic(), error=finish.ERROR_MESSAGE)

    def _first_tokens(self, now: float) -> None:
        """The requests admitted this step produced their first token now."""
        for r in self._fresh:
            r.first_token_at = now
            self.stats.queue_seconds.append(r.scheduled_at - r.arrival)
            self.stats.first_token_seconds.append(now - r.arrival)
        self._fresh = []

    def _tick(self, now: float) -> None:
        if self._last_step_at is not None:
            self.stats.inter_token_seconds.append(now - self._last_step_at)  # once per step: rows share it
        self._last_step_at = now

    def _report(self) -> StepReport:
        """Once per step: the requests that ended leave, and the report carries every Output (each end counted once)
        and the figures, with the gauges as the step left them."""
        ended, self._ended = self._ended, []
        self._retire(ended)
        if not self.runner.slots.n_live:
            self._last_step_at = None  # an idle gap is not an inter-token latency
        outputs = self.outputs.take(ended, self.stats)
        stats = self.stats.take(self.runner.slots.n_live, self.scheduler.n_waiting, self.runner.nbytes)
        return StepReport(outputs, stats)

    def _recover(self) -> StepReport:
        """After a step raised outside any one request: every request still running ends with ERROR."""
        self.isolation.fail(self.isolation.live())
        return self._report()

    def _drain(self) -> StepReport:
        """On the engine's own thread (or an engine never started): the requests still queued or running end
        CANCELLED, each counted once."""
        self._ended += self.scheduler.drain(FinishReason.CANCELLED, time.monotonic())
        return self._report()
