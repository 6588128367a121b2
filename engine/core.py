"""The engine behind its narrow interface (api.EngineClient), in the edge's own process: a thread steps it.

The edge hands in EngineRequests and gets one StepReport per step through the one callback it gave start(): outputs and
figures by value, never a Request. server/engine_process.py serves the same interface from a process of its own.
"""
from __future__ import annotations

import threading
from collections.abc import Sequence

from seqserve.engine.api import Deliver, EngineInfo, EngineRequest, Output, StepReport
from seqserve.engine.engine import Engine
from seqserve.engine.request import Request


class _Outputs:
    """The Sink every request of this core shares: a step's Outputs, handed back once per step."""

    def __init__(self) -> None:
        self.pending: list[Output] = []

    def put(self, request: Request, output: Output) -> None:
        self.pending.append(output)

    def flush(self) -> None:  # the core reports once per step (Engine.on_step), outputs and figures together
        pass


class EngineCore:
    def __init__(self, engine: Engine, info: EngineInfo) -> None:
        self.engine, self.info = engine, info
        self._outputs = _Outputs()
        self._held: dict[int, Request] = {}  # requests added and not yet ended, by the edge's id
        self._lock = threading.Lock()  # add and abort come from the edge's thread, the step from the engine's
        self._deliver: Deliver | None = None
        engine.on_step = self._report

    def start(self, deliver: Deliver) -> None:
        self._deliver = deliver
        self.engine.start()

    def attach(self, deliver: Deliver) -> None:
        """Reports go to deliver, but no thread steps the engine: the caller does, with step() (an engine process
        steps it on its one thread, between reading its socket and writing to it)."""
        self._deliver = deliver

    def has_work(self) -> bool:
        return self.engine.scheduler.has_work()

    def step(self) -> None:
        """One step on the caller's thread, with the engine thread's failure recovery; its report is delivered."""
        self.engine.loop.run_one()

    def add(self, requests: Sequence[EngineRequest]) -> None:
        made = [Request(list(r.input_ids), r.params, sink=self._outputs, stream=r.stream, deadline=r.deadline,
                        forced_bos=r.forced_bos, id=r.id, arrival=r.arrival) for r in requests]
        with self._lock:
            self.engine.submit(made)  # every one or none: QueueFull
            self._held.update((r.id, r) for r in made)

    def abort(self, request_id: int, deadline: bool = False) -> None:
        with self._lock:
            r = self._held.get(request_id)
        if r is not None:
            r.cancel(deadline)
            self.engine.scheduler.sweep_next()  # seen at the very next step, not at the next periodic sweep

    def stop(self, timeout: float = 10.0) -> bool:
        return self.engine.stop(timeout)

    def _report(self) -> None:
        """On the engine thread, at the end of every step: its outputs and figures go back in one report."""
        outputs, self._outputs.pending = tuple(self._outputs.pending), []
        with self._lock:
            for out in outputs:
                if out.result is not None:
                    self._held.pop(out.request_id, None)
        running, waiting, kv = (g or 0 for g in self.engine.gauges)
        report = StepReport(outputs, self.engine.stats.take(running, waiting, kv))
        if self._deliver is not None:
            self._deliver(report)
