"""The engine's thread: it steps while there is work, sleeps while there is none, and drains itself on stop.

Each step returns its report (api.StepReport), which the loop hands to the one deliver callback (vLLM v1's
EngineCore.step / nano-vllm's step return their outputs the same way); an engine process calls run_one itself.
Only this thread touches a started engine's requests: stop() asks and waits for the drained signal, so no request is
ever ended by two threads.
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from seqserve.engine.api import Deliver, StepReport

log = logging.getLogger("seqserve.engine.step.engine")


class Loop:
    def __init__(self, step: Callable[[], StepReport], has_work: Callable[[], bool],
                 recover: Callable[[], StepReport], drain: Callable[[], StepReport]) -> None:
        """step: one engine step; recover: after a step raised (a bug outside any one request); drain: ends what is
        still queued or running, on this thread. Each returns the report deliver gets."""
        self._step, self._has_work, self._recover, self._drain_work = step, has_work, recover, drain
        self.deliver: Deliver | None = None  # every report, in order (None: offline, nobody listens)
        self.after_step: Callable[[], None] | None = None  # tests hold the engine thread here between steps
        self._wake = threading.Condition()
        self._stopping = False
        self._drained = threading.Event()  # set by the engine once stop's cancellations are done
        self.idle = threading.Event()  # set while the thread waits for work (between steps, none in flight)
        self.thread: threading.Thread | None = None

    def start(self) -> None:
        self.thread = threading.Thread(target=self._run, name="seqserve-engine", daemon=True)
        self.thread.start()

    def wake(self) -> None:
        with self._wake:
            self._wake.notify()

    def stop(self, timeout: float) -> bool:
        """Asks the thread to end; it drains itself between two steps. True once drained; False if a step still
        runs after `timeout` s (the thread then drains when that step returns)."""
        with self._wake:
            self._stopping = True
            self._wake.notify()
        if self.thread is None:  # never started (offline): no other thread touches its requests
            self._drain()
            return True
        if not self._drained.wait(timeout):
            log.warning("engine still in a step %.1fs after stop; it cancels its requests when the step returns",
                        timeout)
            return False
        return True

    def _drain(self) -> None:
        try:
            self._hand(self._drain_work())
        finally:
            self._drained.set()

    def _hand(self, report: StepReport) -> None:
        if self.deliver is not None:
            self.deliver(report)

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._stopping and not self._has_work():
                    self.idle.set()
                    self._wake.wait()
                self.idle.clear()
                if self._stopping:
                    break
            self.run_one()
        self._drain()

    def run_one(self) -> None:
        """One step on the caller's thread (this loop's, or an engine process's own:
        engine/remote/engine_process.py)."""
        try:
            report = self._step()
        except Exception:  # a bug outside any one request: never lose one, fail those still running
            log.exception("engine step failed")
            report = self._recover()
        self._hand(report)
        if self.after_step is not None:
            self.after_step()
