"""The engine's plumbing: its thread, the decoder and encoder calls with failure isolation, the per-request guard,
ending a request, and what happens once per step (counting finishes, gauges, flushing every touched sink).

What each failure ends (the client sees INTERNAL with finish.ERROR_MESSAGE, which names no internals):
  * an encoder call that fails: each source is encoded alone, and only those that still fail end;
  * a decoder step that fails: the rows that fail alone (found by halving) end, the step is retried without them;
    if it fails again, no one row is the cause (out of memory, a broken session) and every running row ends;
  * an exception in one request's bookkeeping (`_each`): that request alone;
  * an exception anywhere else in a step (a bug): every request still running; finished ones keep their result.
"""
from __future__ import annotations

import abc
import logging
import threading
import time
from collections.abc import Callable, Iterable

import numpy as np

from seqserve.engine import finish
from seqserve.engine.request import FinishReason, Request, RequestStatus
from seqserve.engine.runner import Runner
from seqserve.engine.scheduler import Plan, Scheduler
from seqserve.engine.stats import Stats
from seqserve.engine.step_output import Need, StepOutput

log = logging.getLogger("seqserve.engine.engine")


class Stepping(abc.ABC):
    def __init__(self, runner: Runner, scheduler: Scheduler) -> None:
        self.runner, self.scheduler = runner, scheduler
        self.stats = Stats()  # this step's figures, plain numbers: taken by whoever reports the step (core.py)
        self.on_step: Callable[[], None] | None = None  # called on the engine thread at the end of every step
        self._sinks: set = set()  # sinks that got events this step: flushed once at its end
        self._ended_waiting: list[Request] = []  # waiting requests this engine ended (their encoder failed)
        self._ended: list[Request] = []  # running requests ended this step: the next schedule retires them
        self._fresh: list[Request] = []  # requests admitted this step: their first token comes from this step
        self.gauges = (None, None, None)  # rows running, requests waiting, KV bytes, as the last step set them
        self._last_step_at: float | None = None
        self.after_step: Callable[[], None] | None = None  # tests hold the engine thread here between steps
        self._wake = threading.Condition()
        self._stopping = False
        self._drained = threading.Event()  # set by the engine once stop's cancellations are done
        self._thread: threading.Thread | None = None

    @abc.abstractmethod
    def step(self) -> None:
        """One step of the engine (engine.py)."""

    @abc.abstractmethod
    def _forget(self, r: Request) -> None:
        """The engine drops its per-request state."""

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="seqserve-engine", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> bool:
        """Asks the engine to end. The engine thread itself ends whatever is still queued or running as CANCELLED
        (the service drained first), between two steps, so no request is ever ended by two threads. True once that
        is done; False if a step still runs after `timeout` s: the engine then drains itself when that step returns."""
        with self._wake:
            self._stopping = True
            self._wake.notify()
        if self._thread is None:  # never started (offline): no other thread touches its requests
            self._drain()
            return True
        if not self._drained.wait(timeout):
            log.warning("engine still in a step %.1fs after stop; it cancels its requests when the step returns",
                        timeout)
            return False
        return True

    def _drain(self) -> None:
        """On the engine's own thread (or an engine never started): the requests still queued or running end
        CANCELLED, each counted once, and the drained signal is set."""
        try:
            ended = [r for r in [*self.scheduler.waiting, *self.scheduler.running] if not r.done]
            self.scheduler.drain(FinishReason.CANCELLED, time.monotonic())
            for r in ended:
                self.stats.finished.append(r.finish_reason.value)
                r.sink.flush()
            if self.on_step is not None:
                self.on_step()
        finally:
            self._drained.set()

    def _loop(self) -> None:
        while True:
            with self._wake:
                while not self._stopping and not self.scheduler.has_work():
                    self._wake.wait()
                if self._stopping:
                    break
            try:
                self.step()
            except Exception:  # a bug outside any one request: never lose one, fail those still running
                log.exception("engine step failed")
                self._fail(self._live())
                self._emit(Plan([], [], [], []))
            if self.after_step is not None:
                self.after_step()
        self._drain()

    def _each(self, items: Iterable, work: Callable) -> None:
        """work(item) for each item (a record, a request or a BeamResult) whose request still runs; an exception
        ends that request alone with ERROR and the others go on."""
        for item in items:
            r = getattr(item, "request", item)
            if r.done:
                continue
            try:
                work(item)
            except Exception:
                log.exception("request %d failed in the engine's bookkeeping; ending it alone", r.id)
                self._ended_by_engine(r, FinishReason.ERROR, time.monotonic(), error=finish.ERROR_MESSAGE)

    def _ended_by_engine(self, r: Request, reason: FinishReason, now: float, **result) -> None:
        """Ends a running request with its result; the next schedule retires its rows."""
        if r.done:
            return
        r.end(reason, now, **result)
        self._sinks.add(r.sink)
        self._forget(r)
        self._ended.append(r)

    def _encode(self, requests: list[Request]) -> None:
        try:
            self.stats.encoder_seconds.append(self.runner.encode(requests))
        except Exception:
            log.exception("encoder failed for %d sources; isolating the cause", len(requests))
            for r in requests:
                try:
                    self.runner.encode([r])
                except Exception:
                    self.scheduler.unencode([r])
                    running = r.status is RequestStatus.RUNNING  # also retired by the next schedule
                    if not r.done:
                        r.end(FinishReason.ERROR, time.monotonic(), finish.ERROR_MESSAGE)
                        (self._ended if running else self._ended_waiting).append(r)
                        self._sinks.add(r.sink)

    def _run(self, need: Need = Need.LOGITS) -> StepOutput | None:
        start = time.perf_counter()
        try:
            logits = self.runner.run_step(need)
        except Exception:
            log.exception("decoder step failed for %d rows; isolating the cause", self.runner.slots.n_live)
            self._fail(self._culprits(self._live()))
            if not self.runner.slots.n_live:
                return None
            try:
                logits = self.runner.run_step(need)
            except Exception:  # not caused by any one row (out of memory, a broken session): fail everyone
                log.exception("decoder step failed again without the failing rows")
                self._fail(self._live())
                return None
        self.stats.decoder_seconds.append(time.perf_counter() - start)
        self.stats.batch_rows.append(self.runner.slots.n_live)
        return logits

    def _culprits(self, rows: list[int]) -> list[int]:
        """The rows whose step fails on their own, found by halving (a handful of probes for one bad row)."""
        try:
            self.runner.probe(rows)
            return []
        except Exception:
            if len(rows) == 1:
                return rows
            return self._culprits(rows[: len(rows) // 2]) + self._culprits(rows[len(rows) // 2 :])

    def _live(self) -> list[int]:
        return np.flatnonzero(self.runner.slots.live).tolist()

    def _fail(self, rows: list[int]) -> None:
        """These rows' requests end with ERROR and leave now, unless they had finished (their result stands)."""
        slots, now = self.runner.slots, time.monotonic()
        failed = list(dict.fromkeys(slots.requests[i] for i in rows))  # a beam request holds several rows
        for r in failed:
            self._ended_by_engine(r, FinishReason.ERROR, now, error=finish.ERROR_MESSAGE)
        self.runner.retire(failed)

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

    def _emit(self, plan: Plan) -> None:
        """Once per step: finishes are counted (each once, in the step it ended), gauges are set, then every touched
        sink hands its events on (so a client that has its answer finds it counted, and its rows freed)."""
        self.runner.retire(self._ended)  # the next schedule retires them from the scheduler (the runner: a no-op)
        for r in [*self._ended, *plan.abandoned, *plan.dropped, *self._ended_waiting]:
            self.stats.finished.append(r.finish_reason.value)
            self._sinks.add(r.sink)
        self._ended_waiting.clear()
        self.gauges = (self.runner.slots.n_live, self.scheduler.n_waiting, self.runner.nbytes)
        if not self.runner.slots.n_live:
            self._last_step_at = None  # an idle gap is not an inter-token latency
        for sink in self._sinks:
            sink.flush()
        self._sinks.clear()
        if self.on_step is not None:
            self.on_step()
