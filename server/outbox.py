"""The service's Sink: a request's Events cross from the engine thread to the gRPC event loop, one hop per step.

The engine puts events during a step and flushes once at its end, so 64 streams advancing together cost one
call_soon_threadsafe per step, not 64. Each request's events land on its own asyncio.Queue, opened by the service.
"""
from __future__ import annotations

import asyncio

from seqserve.engine.request import Event, Request


class Outbox:
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._queues: dict[int, asyncio.Queue] = {}  # request id -> its queue (touched only on the event loop)
        self._pending: list[tuple[int, Event]] = []  # filled and flushed only by the engine thread

    def open(self, request: Request) -> asyncio.Queue:
        """Event loop: the queue this request's events arrive on (call before submitting it)."""
        queue = self._queues[request.id] = asyncio.Queue()
        return queue

    def put(self, request: Request, event: Event) -> None:
        self._pending.append((request.id, event))

    def flush(self) -> None:
        if not self._pending:
            return
        batch, self._pending = self._pending, []
        try:
            self.loop.call_soon_threadsafe(self._deliver, batch)
        except RuntimeError:  # the event loop is closed (shutdown): nobody is waiting any more
            pass

    def _deliver(self, batch: list[tuple[int, Event]]) -> None:
        for request_id, event in batch:
            queue = self._queues.get(request_id)
            if queue is not None:
                queue.put_nowait(event)
            if event.finish_reason is not None:
                self._queues.pop(request_id, None)
