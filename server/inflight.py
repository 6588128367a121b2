"""The calls in flight: each call's deadline, rows and request bytes, and what the drain needs (idle, abort).

A call is in flight from the moment its handler starts until its status is sent, queued or running alike; its
request's bytes count against max_inflight_bytes for all that time (a running row keeps its request too).
"""
from __future__ import annotations

import asyncio
import time

import grpc

from seqserve.server.metrics import Metrics
from seqserve.server.pipe import Pipe

# The client's deadline runs out a little before the server's (the server's clock starts when the call arrives), so a
# call cancelled this close to its deadline was ended by the deadline: it counts, and ends its rows, as DEADLINE.
DEADLINE_SLACK_SECONDS = 0.05


class Call:
    """One RPC: its deadline, its request's bytes, and the requests it added to its model's engine: (id, the pipe
    their outputs arrive on)."""

    def __init__(self, context: grpc.aio.ServicerContext) -> None:
        remaining = context.time_remaining()
        self.deadline = None if remaining is None else time.monotonic() + remaining
        self.rows: list[tuple[int, Pipe]] = []
        self.bytes = 0  # its request's payload, held against max_inflight_bytes while the call lasts
        self.model = None  # the ServedModel it runs on, once its request named one (service._model)

    def expired(self, now: float) -> bool:
        """Whether the call's deadline (less DEADLINE_SLACK_SECONDS) has passed."""
        return self.deadline is not None and now >= self.deadline - DEADLINE_SLACK_SECONDS

    def release(self) -> None:
        """The call ended: rows still in flight leave the batch, as DEADLINE when the call ended by its deadline (so
        the finish and the call's status agree with what the client saw), else CANCELLED."""
        if self.model is not None:
            self.model.cancel(self.rows, deadline=self.expired(time.monotonic()))


class InFlight:
    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics
        self.calls: set[Call] = set()
        self.bytes = 0  # request bytes held by the calls in flight
        self.last_arrival = float("-inf")  # time.monotonic() of the latest call's start (the drain waits for quiet)
        self._idle = asyncio.Event()
        self._idle.set()
        metrics.inflight_bytes.set_function(lambda: self.bytes)  # read at scrape time: no gauge update per call

    def __len__(self) -> int:
        return len(self.calls)

    def enter(self, call: Call) -> None:
        self.last_arrival = time.monotonic()
        self.calls.add(call)
        self._idle.clear()

    def hold(self, call: Call, size: int, most: int) -> bool:
        """Holds the call's request bytes; False (nothing held) when they would take the total beyond most."""
        if self.bytes + size > most:
            return False
        call.bytes = size
        self.bytes += size
        return True

    def leave(self, call: Call) -> None:
        self.calls.discard(call)
        self.bytes -= call.bytes
        if not self.calls:
            self._idle.set()

    def abort(self) -> int:
        """Every call still in flight ends UNAVAILABLE: its rows are aborted, the engine ends them CANCELLED in its
        reports (the one way back), and the service reads a CANCELLED finish of a live call as "the server
        stopped". Returns how many calls there were."""
        for call in self.calls:
            if call.model is not None:
                call.model.cancel(call.rows)
        return len(self.calls)

    async def wait_idle(self, timeout: float) -> bool:
        """True once no call is in flight, False if the timeout came first."""
        if self._idle.is_set():  # wait_for with timeout 0 would time out before even looking
            return True
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
            return True
        except TimeoutError:
            return False
