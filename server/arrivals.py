"""A drain's last wait: the calls that reach the server after the ones in flight ended (App.drain)."""
from __future__ import annotations

import asyncio
import time

QUIET_SECONDS = 0.1  # no new call for this long: gRPC's backlog of accepted calls is empty
STALL_SECONDS = 0.2  # a turn of QUIET_SECONDS that took longer: the machine stalled the process, which took no call


async def hold_arrivals(service, window: float) -> None:
    """The calls that reach the server after the ones in flight ended: gRPC may hold calls it accepted but has
    not handed to the service yet (a busy event loop takes them one at a time), and clients keep sending new
    ones (retries, a balancer that cannot see the drain). A call in gRPC core when server.stop begins ends
    CANCELLED, and one answered UNAVAILABLE at once comes right back. So new calls are held, unanswered, until
    none arrived for QUIET_SECONDS (at most `window`, --drain-backlog-seconds): a client waiting for its held call
    sends no other. App.close() then begins server.stop and answers the held calls UNAVAILABLE. A stalled turn is
    neither quiet nor counted against the window (up to as much stall again: the wall time stays bounded)."""
    service.hold_new_calls()
    counted = stalled = 0.0  # seconds of the window the process ran; seconds it was stalled, not counted
    while counted < window:
        started = time.monotonic()
        await asyncio.sleep(min(QUIET_SECONDS, window - counted))
        took = time.monotonic() - started
        # Why calls ended CANCELLED under load: a busy machine stalled the process (1.9 s), the window ran out
        # meanwhile, and server.stop cancelled the calls gRPC had accepted but the stalled loop had not taken.
        stall = min(max(0.0, took - STALL_SECONDS), window - stalled)
        stalled, counted = stalled + stall, counted + took - stall
        if not stall and service.inflight.last_arrival < started:  # quiet: gRPC holds no call, nor do clients send
            return
