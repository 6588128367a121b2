"""One served model as the gRPC edge sees it: its engine (an api.EngineClient), the outbox its reports arrive in,
its tokenizer, limits, ModelInfo, and its calls in flight.

The service keeps one per name; a changed or removed model leaves the service's table at once (new calls go to its
new version, or get NOT_FOUND) and drains: its calls in flight finish on its own engine, which then stops.
"""
from __future__ import annotations

import asyncio

from seqserve.contract.languages import Languages
from seqserve.engine.api import EngineClient
from seqserve.engine.limits import Limits
from seqserve.engine.request import SamplingParams
from seqserve.server.inflight import Call
from seqserve.server.metrics import ModelMetrics
from seqserve.server.outbox import Outbox
from seqserve.server.pipe import Pipe


class ServedModel:
    def __init__(self, name: str, engine: EngineClient, outbox: Outbox, tokenizer, limits: Limits, info,
                 defaults: SamplingParams, max_chars: int, metrics: ModelMetrics, memory_bytes: int = 0) -> None:
        self.name, self.engine, self.outbox, self.tokenizer, self.limits = name, engine, outbox, tokenizer, limits
        self.info, self.defaults, self.max_chars, self.metrics = info, defaults, max_chars, metrics
        self.memory_bytes = memory_bytes
        self.languages = Languages.from_dict(engine.info.languages)  # a multilingual model's
        self.calls: set[Call] = set()  # calls in flight on this model
        self._idle: asyncio.Event | None = None

    def enter(self, call: Call) -> None:
        self.calls.add(call)

    def leave(self, call: Call) -> None:
        self.calls.discard(call)
        if not self.calls and self._idle is not None:
            self._idle.set()

    async def wait_idle(self, timeout: float) -> bool:
        """True once none of this model's calls is in flight, False if the timeout came first."""
        if not self.calls:
            return True
        if self._idle is None:
            self._idle = asyncio.Event()
        self._idle.clear()  # calls are in flight: the last to leave sets it
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
            return True
        except TimeoutError:
            return False

    def cancel(self, rows: list[tuple[int, Pipe]], deadline: bool = False) -> None:
        """The engine ends these rows at its next step (DEADLINE or CANCELLED), each with its last output; a row
        whose last output already came is not asked about again."""
        for request_id, _ in rows:
            if self.outbox.is_open(request_id):
                self.engine.abort(request_id, deadline=deadline)

    def abort(self) -> int:
        """This model's calls still in flight end UNAVAILABLE (as InFlight.abort does for the whole server)."""
        for call in self.calls:
            self.cancel(call.rows)
        return len(self.calls)
