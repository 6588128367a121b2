"""The one way back from an engine: its StepReports reach the gRPC event loop, one hop per report.

An engine calls deliver once per step, from its own thread (engine/step/core.py) or on the loop itself (a client that
reads another process's reports there). Reports that arrive while a hop is pending join it: a busy loop takes every
waiting report in one hop, and each stream then wakes once for all of them (one message with every new token), not
once per step. A hop first applies each step's figures to the metrics, then hands every Output to its request's
Pipe (server/pipe.py), so a client that has its answer finds it counted. A request's pipe closes with its last
output (the one that carries its Result, or its refusal).
"""
from __future__ import annotations

import asyncio
import threading

from seqserve.engine.api import StepReport
from seqserve.server.engine_metrics import EngineMetrics
from seqserve.server.pipe import Pipe


class Outbox:
    def __init__(self, loop: asyncio.AbstractEventLoop, metrics: EngineMetrics) -> None:
        self.loop, self.metrics = loop, metrics
        self._queues: dict[int, Pipe] = {}  # request id -> its pipe (touched only on the event loop)
        self._pending: list[StepReport] = []  # reports waiting for the hop already scheduled
        self._lock = threading.Lock()  # deliver may come from the engine's thread while the loop takes the reports

    def open(self, request_id: int) -> Pipe:
        """Event loop: the pipe this request's outputs arrive on (opened before the engine has the request)."""
        pipe = self._queues[request_id] = Pipe()
        return pipe

    def is_open(self, request_id: int) -> bool:
        """Whether the request's last output is still to come (the engine may still hold it)."""
        return request_id in self._queues

    def close(self, request_id: int) -> None:
        """The engine never took the request (a refused add): nothing will arrive."""
        self._queues.pop(request_id, None)

    def deliver(self, report: StepReport) -> None:
        """The engine's callback (api.Deliver), from any thread: the report joins the pending hop, or schedules one."""
        with self._lock:
            self._pending.append(report)
            if len(self._pending) > 1:  # a hop is scheduled and has not run yet: it takes this one too
                return
        try:
            if _running_loop() is self.loop:
                self.loop.call_soon(self._dispatch)
            else:
                self.loop.call_soon_threadsafe(self._dispatch)
        except RuntimeError:  # the event loop is closed (shutdown): nobody is waiting any more
            pass

    def _dispatch(self) -> None:
        with self._lock:
            reports, self._pending = self._pending, []
        for report in reports:  # in order: a request's outputs arrive as the engine made them
            self.metrics.apply(report.stats)
            for out in report.outputs:
                pipe = self._queues.get(out.request_id)
                if pipe is not None:
                    pipe.put(out)
                if out.result is not None or out.refused is not None:  # its last output
                    self._queues.pop(out.request_id, None)


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None
