"""The engine: one step = schedule -> execute -> update -> output, composed of its collaborators.

Requests join and leave the running batch between any two steps. onnxruntime runs in the engine's thread
(engine/loop.py; it releases the GIL), so the edge is never blocked by inference. The scheduler decides who runs,
the runner executes (engine/isolation.py confines a failure to the requests that cause it), TokenChoice
(engine/update.py) picks every row's token, and engine/outputs.py writes everything that goes back.
"""
from __future__ import annotations

import collections
import logging
import time

import numpy as np
from tokenizers import Tokenizer

from seqserve.engine import finish
from seqserve.engine.beam import Beams
from seqserve.engine.constraints import Constraints
from seqserve.engine.isolation import Isolation
from seqserve.engine.loop import Loop
from seqserve.engine.nbest import BeamResult
from seqserve.engine.outputs import Outputs
from seqserve.engine.request import FinishReason, Request, RequestStatus
from seqserve.engine.runner import Runner
from seqserve.engine.running import Running, views
from seqserve.engine.scheduler import Plan, Scheduler
from seqserve.engine.slots import Joining
from seqserve.engine.stats import Stats
from seqserve.engine.step_output import Need, StepOutput
from seqserve.engine.update import TokenChoice

log = logging.getLogger(__name__)


class Engine:
    def __init__(self, runner: Runner, tokenizer: Tokenizer, scheduler: Scheduler, stream_interval: int = 1):
        self.runner, self.scheduler, self.tokenizer = runner, scheduler, tokenizer
        special = runner.manifest.special_tokens
        self.eos_id = special["eos_id"]
        self.constraints = Constraints.from_generation(  # the model's token rules; a target language per row
            runner.manifest.generation, per_row_first=bool(runner.manifest.languages))
        rules = self.constraints.rules(special)  # engine/token_rules.py: every row's token rules, in order
        self.beams = Beams(runner, self.eos_id, rules)
        self.choice = TokenChoice(runner, rules, self.constraints.never_sampled(special), self.eos_id, self.beams)
        self.stats = Stats()  # this step's figures, plain numbers: taken by whoever reports the step (core.py)
        self.outputs = Outputs(tokenizer, self.eos_id, stream_interval)
        self.isolation = Isolation(runner, self.stats, self._end_error, lambda slot: self._placed[
            runner.slots.owners[slot]])
        self.loop = Loop(self.step, scheduler.has_work, self._recover, self._drain)
        self.on_step = None  # called on the engine thread at the end of every step
        self.gauges = (None, None, None)  # rows running, requests waiting, KV bytes, as the last step set them
        self._cross: dict[int, object] = {}  # encode-ahead: each encoded source's cross K/V by request id
        self._placed: dict[int, Request] = {}  # requests holding rows, by id (until the scheduler retires them)
        self._running: dict[Request, Running] = {}  # every running greedy or sampled request's record
        self._views: tuple[list[Running], ...] | None = None  # running.views: None when a record joined or left
        self._ended: list[Request] = []  # running requests ended this step: the next schedule retires them
        self._ended_waiting: list[Request] = []  # waiting requests this engine ended (their encoder failed)
        self._fresh: list[Request] = []  # requests admitted this step: their first token comes from this step
        self._last_step_at: float | None = None

    # The thread (engine/loop.py): tests hold it between steps through after_step.
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

    @property
    def _thread(self):
        return self.loop.thread

    def submit(self, requests: list[Request]) -> None:
        """Queues every request or none (raises QueueFull when they do not fit the waiting queue); wakes the loop."""
        self.scheduler.add(requests)
        self.loop.wake()

    def generate(self, requests: list[Request]) -> list[Request]:
        """Offline: runs every request to its end in the calling thread (warm-up, verify, quality, bench)."""
        pending = collections.deque(requests)
        while pending or self.scheduler.has_work():
            while pending and self.scheduler.n_waiting < self.scheduler.cfg.max_waiting:
                self.submit([pending.popleft()])
            self.step()
        return requests

    def step(self) -> None:
        plan = self.scheduler.schedule(time.monotonic(), self._ended)
        self._ended = []
        self._place(plan)
        if self.runner.slots.n_live:
            out = self.isolation.run(self._need())
            if out is not None:
                self._update(out, time.monotonic())
        self._output(plan)

    def _place(self, plan: Plan) -> None:
        """Frees the rows that left, runs the encoder (admitted rows without K/V, and some ahead), places rows."""
        self.runner.retire([r.id for r in plan.retired])
        for r in plan.retired:
            self._forget(r)
        for r in plan.dropped:
            self._cross.pop(r.id, None)  # an encoded source that never ran frees its K/V here
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
        for r in failed:
            running = r.status is RequestStatus.RUNNING  # also retired by the next schedule
            if self.outputs.end(r, FinishReason.ERROR, time.monotonic(), finish.ERROR_MESSAGE):
                (self._ended if running else self._ended_waiting).append(r)

    def _join(self, r: Request) -> None:
        """A request placed in the batch: a beam request joins the beam component, any other gets its record."""
        if r.n_rows > 1:
            self.beams.admit([r])
            return
        self._running[r], self._views = self.outputs.record(r), None

    def _forget(self, r: Request) -> None:
        """A retired request: its state and its place."""
        self._forget_state(r)
        self._placed.pop(r.id, None)

    def _records(self) -> tuple[list[Running], ...]:
        if self._views is None:
            self._views = views(self._running.values())
        return self._views

    def _need(self) -> Need:
        sampled, scored = self._records()[:2]
        return self.choice.need(sampled, scored)

    def _update(self, out: StepOutput, now: float) -> None:
        """Chooses every row's token, appends it, and ends the rows a finish rule says are done."""
        slots, hi, each = self.runner.slots, self.runner.slots.hi, self.isolation.each
        sampled, scored, texted, tracked = self._records()
        for rec in tracked:  # the records this step reads by row (plain greedy rows cost nothing here)
            rec.slot = slots.slot_of(rec.request.id)
        chosen, single, lps = self.choice.choose(out, sampled, scored, each)
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
        generated = int(appended.sum()) + self._advance_beams(out, now)
        self.stats.generated_tokens += generated  # EOS is not returned, so not counted: equals usage
        self._tick(now)

    def _finish(self, rec: Running, reason: FinishReason, now: float) -> None:
        output_ids = self.runner.slots.output(rec.slot)
        reason, sequence = self.outputs.final(rec, output_ids, reason)
        self._end(rec.request, reason, now, sequences=(sequence,), generated=len(output_ids))

    def _advance_beams(self, out: StepOutput, now: float) -> int:
        """Every beam request takes its step (engine/beam.py: one vector step for them all, so a failure there is no
        one request's and ends them all); those that ended get their result. Returns their tokens (usage)."""
        try:
            ended = self.choice.advance(out, now)
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
        """Ends a running request with its result; the next schedule retires its rows."""
        if self.outputs.end(r, reason, now, **result):
            self._forget_state(r)
            self._ended.append(r)

    def _forget_state(self, r: Request) -> None:
        if self._running.pop(r, None) is not None:
            self._views = None
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

    def _output(self, plan: Plan) -> None:
        """Once per step: finishes are counted (each once, in the step it ended), gauges are set, then every touched
        sink hands its events on (so a client that has its answer finds it counted, and its rows freed)."""
        self.runner.retire([r.id for r in self._ended])  # the next schedule retires them from the scheduler
        ended = [*self._ended, *plan.abandoned, *plan.dropped, *self._ended_waiting]
        self._ended_waiting.clear()
        self.gauges = (self.runner.slots.n_live, self.scheduler.n_waiting, self.runner.nbytes)
        if not self.runner.slots.n_live:
            self._last_step_at = None  # an idle gap is not an inter-token latency
        self.outputs.hand_off(ended, self.stats, self.on_step)

    def _recover(self) -> None:
        """After a step raised outside any one request: every request still running ends with ERROR."""
        self.isolation.fail(self.isolation.live())
        self._output(Plan([], [], [], []))

    def _drain(self) -> None:
        """On the engine's own thread (or an engine never started): the requests still queued or running end
        CANCELLED, each counted once."""
        ended = [r for r in [*self.scheduler.waiting, *self.scheduler.running] if not r.done]
        self.scheduler.drain(FinishReason.CANCELLED, time.monotonic())
        self._cross.clear()
        self.outputs.hand_off(ended, self.stats, self.on_step)
