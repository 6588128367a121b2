"""The gRPC edge drives any api.EngineClient: here a client that exposes nothing but the interface (so any reach past
it into the scheduler, the runner or the Engine raises) and calls deliver on the event loop itself, as a client
reading another process's reports there does. Answers, cancels, queue-full refusals, metrics and the drain hold."""
from __future__ import annotations

import asyncio

import grpc
import pytest
from grpc_harness import StepGate, request, wait_for

from seqserve.engine.api import EngineClient, EngineInfo
from seqserve.server.app import App
from seqserve.v1 import seqserve_pb2 as pb

LONG = dict(min_new_tokens=30, max_new_tokens=30)


class OnTheLoop:
    """An EngineClient of its own: forwards to an in-process core and hands every report to deliver ON the event
    loop. Its attributes are the interface's and no more (__slots__)."""

    __slots__ = ("info", "_inner", "_loop", "added", "aborted", "stopped")

    def __init__(self, inner: EngineClient, loop: asyncio.AbstractEventLoop) -> None:
        self.info: EngineInfo = inner.info
        self._inner, self._loop = inner, loop
        self.added, self.aborted, self.stopped = [], [], 0

    def start(self, deliver) -> None:
        self._inner.start(lambda report: self._loop.call_soon_threadsafe(deliver, report))

    def add(self, requests) -> None:
        self._inner.add(requests)
        self.added += [r.id for r in requests]

    def abort(self, request_id: int, deadline: bool = False) -> None:
        self.aborted.append((request_id, deadline))
        self._inner.abort(request_id, deadline)

    def stop(self, timeout: float = 10.0) -> bool:
        self.stopped += 1
        return self._inner.stop(timeout)


class OnTheLoopApp(App):
    def _load(self, source, threads, used):
        loaded = super()._load(source, threads, used)
        loaded.core = loaded.engine  # the tests hold its Engine between steps
        loaded.engine = OnTheLoop(loaded.engine, self.loop)
        return loaded

    async def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        await super().start()


@pytest.fixture
def make(make_server):
    def make_one(**overrides):
        s = make_server(app_class=OnTheLoopApp, **overrides)
        s.client, s.held_engine = s.model.engine, s.model.core.engine
        return s
    return make_one


def test_an_engine_client_of_its_own_answers_every_method_as_the_in_process_one(make, served, heldout):
    s, n_tokens = make(), 0
    for src, _ in heldout[:3]:
        want = served.stub.Generate(request(src), timeout=30)
        got = s.stub.Generate(request(src), timeout=30)
        pieces = list(s.stub.GenerateStream(request(src), timeout=30))
        assert (got.text, list(got.token_ids)) == (want.text, list(want.token_ids))
        assert "".join(p.text for p in pieces) == want.text
        assert [t for p in pieces for t in p.token_ids] == list(want.token_ids)
        n_tokens += 2 * len(want.token_ids)
    batch = s.stub.GenerateBatch(pb.GenerateBatchRequest(inputs=[h[0] for h in heldout[:2]]), timeout=30)
    assert [r.text for r in batch.results] == [served.stub.Generate(request(h[0]), timeout=30).text
                                               for h in heldout[:2]]
    assert len(set(s.client.added)) == len(s.client.added) == 3 * 2 + 2  # one id per row, never reused
    assert s.client.aborted == []  # every row ended with its output: nothing to abort
    info = s.stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=10)
    assert info.execution_provider == s.client.info.provider and info.variant == s.client.info.variant
    n_tokens += sum(len(r.token_ids) for r in batch.results)
    wait_for(lambda: s.metric("seqserve_generated_tokens_total") == n_tokens, what="every token counted")
    assert s.metric("seqserve_finished_requests_total") == 8 and s.metric("seqserve_input_tokens_total") > 0
    assert s.metric("seqserve_running_requests") == s.metric("seqserve_waiting_requests") == 0


def test_a_cancel_and_a_full_queue_go_through_the_interface(make, heldout):
    s = make(max_batch_size=1, max_waiting=1, max_batch_inputs=1)
    gate = StepGate(s.held_engine, s.settle)
    gate.close()
    running = s.stub.GenerateStream(request(heldout[0][0], **LONG), timeout=60)
    next(running)
    assert s.metric("seqserve_running_requests") == 1  # from the held step's report, delivered on the loop
    waiting = s.stub.Generate.future(request(heldout[1][0], **LONG), timeout=60)
    wait_for(lambda: len(s.client.added) == 2, what="the second request queued")
    with pytest.raises(grpc.RpcError) as err:
        s.stub.Generate(request(heldout[2][0]), timeout=30)
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and err.value.details().startswith("queue full: ")
    assert s.metric("seqserve_rejected_requests_total", reason="queue_full") == 1
    running.cancel()
    wait_for(lambda: s.client.aborted == [(s.client.added[0], False)], what="the cancel to reach the engine")
    gate.open()
    assert waiting.result(60).finish_reason == pb.FINISH_REASON_LENGTH
    wait_for(lambda: s.metric("seqserve_finished_requests_total", reason="cancelled") == 1, what="the cancel counted")


def test_the_drain_stops_the_engine_through_the_interface(make, heldout):
    s = make()
    s.stub.Generate(request(heldout[0][0]), timeout=30)
    s.run_async(s.app.drain()).result(60)
    assert s.client.stopped == 1

