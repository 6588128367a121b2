"""The engine behind its narrow interface (api.EngineClient), in the edge's own process: a thread steps it.

The edge hands in EngineRequests and gets each step's StepReport through the one callback it gave start(): outputs
and figures by value, never a Request. An abort is a message the next step drains. engine/remote/engine_process.py
serves
the same interface from a process of its own, stepping the engine itself (attach, step).
"""
from __future__ import annotations

from collections.abc import Sequence

from seqserve.engine.api import Deliver, EngineInfo, EngineRequest
from seqserve.engine.request import Request
from seqserve.engine.step.engine import Engine


class EngineCore:
    def __init__(self, engine: Engine, info: EngineInfo) -> None:
        self.engine, self.info = engine, info

    def start(self, deliver: Deliver) -> None:
        self.engine.loop.deliver = deliver
        self.engine.start()

    def attach(self, deliver: Deliver) -> None:
        """Reports go to deliver, but no thread steps the engine: the caller does, with step() (an engine process
        steps it on its one thread, between reading its socket and writing to it)."""
        self.engine.loop.deliver = deliver

    def has_work(self) -> bool:
        return self.engine.scheduler.has_work()

    def step(self) -> None:
        """One step on the caller's thread, with the engine thread's failure recovery; its report is delivered."""
        self.engine.loop.run_one()

    def add(self, requests: Sequence[EngineRequest]) -> None:
        self.engine.submit([Request(list(r.input_ids), r.params, stream=r.stream, deadline=r.deadline,
                                    forced_bos=r.forced_bos, id=r.id, arrival=r.arrival)
                            for r in requests])  # every one or none: QueueFull

    def abort(self, request_id: int, deadline: bool = False) -> None:
        self.engine.abort(request_id, deadline)

    def stop(self, timeout: float = 10.0) -> bool:
        return self.engine.stop(timeout)
