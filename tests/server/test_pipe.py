"""server/pipe.py: a request's outputs reach its handler in order, every one that arrived at once, and a handler that
left while waiting breaks nothing."""
from __future__ import annotations

import asyncio

from seqserve.engine.api import Output
from seqserve.server.pipe import Pipe


def test_a_take_gets_everything_since_the_last_one_in_order():
    async def run():
        pipe = Pipe()
        for i in range(3):
            pipe.put(Output(7, (i,), str(i)))
        first = await pipe.take()
        waiting = asyncio.ensure_future(pipe.take())
        await asyncio.sleep(0)
        assert not waiting.done()  # nothing new: it waits
        pipe.put(Output(7, (3,), "3"))
        pipe.put(Output(7, (4,), "4"))
        return first, await waiting

    first, second = asyncio.run(run())
    assert [o.token_ids for o in first] == [(0,), (1,), (2,)]
    assert [o.token_ids for o in second] == [(3,), (4,)]


def test_a_handler_cancelled_while_waiting_leaves_the_pipe_usable():
    async def run():
        pipe = Pipe()
        waiting = asyncio.ensure_future(pipe.take())
        await asyncio.sleep(0)
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)
        pipe.put(Output(1, text="late"))  # no error for the waiter that left
        return await pipe.take()

    assert [o.text for o in asyncio.run(run())] == ["late"]
