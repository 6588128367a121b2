"""One request's outputs on their way to its call's handler, on the event loop: a list and at most one waiter.

The Outbox puts every Output of a step; the handler takes all that arrived since its last take at once (a stream's
message then carries every token since its last one). Lighter than an asyncio.Queue, which wakes a getter and keeps
task accounting per item: the edge puts one per streamed token.
"""
from __future__ import annotations

import asyncio

from seqserve.engine.api import Output


class Pipe:
    __slots__ = ("_items", "_waiter")

    def __init__(self) -> None:
        self._items: list[Output] = []
        self._waiter: asyncio.Future | None = None  # the handler waiting in take(), if it is

    def put(self, output: Output) -> None:
        self._items.append(output)
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():  # (a handler cancelled while waiting left a cancelled one)
            waiter.set_result(None)

    async def take(self) -> list[Output]:
        """Every output that arrived since the last take, in order; waits for the first."""
        while not self._items:
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
        items, self._items = self._items, []
        return items
