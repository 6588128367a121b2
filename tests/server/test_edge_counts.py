"""seqserve_requests_total counts every Generation call grpc.aio hands to the server, by the code its client saw:
calls whose deadline passed while the server's event loop was held (as an overloaded loop holds them) included,
though their handler never read their request (server/edge.py)."""
from __future__ import annotations

import collections
import threading

import grpc
import pytest
from grpc_harness import request, wait_for

from seqserve.v1 import seqserve_pb2 as pb

CALLS = 12  # per method
DEADLINE = 0.3  # seconds: passes while the event loop is held


def _counted(s) -> collections.Counter:
    return collections.Counter({(sample.labels["method"], sample.labels["code"]): sample.value
                                for family in s.app.metrics.registry.collect() for sample in family.samples
                                if sample.name == "seqserve_requests_total" and sample.value})


def _hold_loop(s) -> threading.Event:
    """Holds the server's event loop (gRPC core keeps accepting calls meanwhile) until the returned event is set."""
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        held.set()
        release.wait(60)

    s.loop.call_soon_threadsafe(hold)
    assert held.wait(10)
    return release


def test_calls_that_end_before_their_request_is_read_are_counted_as_their_clients_saw_them(make_server, heldout):
    s = make_server()
    text = heldout[0][0]
    for call in (lambda: s.stub.Generate(request(text), timeout=30),
                 lambda: list(s.stub.GenerateStream(request(text), timeout=30)),
                 lambda: s.stub.GenerateBatch(pb.GenerateBatchRequest(inputs=[text]), timeout=30)):
        call()  # one OK call of each method, counted once
    release = _hold_loop(s)
    try:
        calls = [("Generate", s.stub.Generate.future(request(text), timeout=DEADLINE)) for _ in range(CALLS)]
        calls += [("GenerateStream", s.stub.GenerateStream(request(text), timeout=DEADLINE)) for _ in range(CALLS)]
        calls += [("GenerateBatch", s.stub.GenerateBatch.future(pb.GenerateBatchRequest(inputs=[text]),
                                                                timeout=DEADLINE)) for _ in range(CALLS)]
        seen = collections.Counter((method, call.code().name) for method, call in calls)  # each waits for its end
    finally:
        release.set()
    assert seen == {(m, "DEADLINE_EXCEEDED"): CALLS for m in ("Generate", "GenerateStream", "GenerateBatch")}
    expected = seen + collections.Counter({(m, "OK"): 1 for m in ("Generate", "GenerateStream", "GenerateBatch")})
    wait_for(lambda: sum(_counted(s).values()) >= sum(expected.values()), timeout=30,
             what=f"the server to count {sum(expected.values())} calls (it counted {dict(_counted(s))})")
    assert _counted(s) == expected
    assert s.stub.Generate(request(text), timeout=30).token_ids  # the server goes on serving
    wait_for(lambda: _counted(s)[("Generate", "OK")] == 2, what="the next call counted OK")


def test_a_refused_token_is_counted_once(make_server, heldout):
    """With bearer tokens, auth (the outer interceptor) refuses before the edge reads the request: one count."""
    s = make_server(auth_tokens="secret-token-0123456789")
    with pytest.raises(grpc.RpcError) as info:
        s.stub.Generate(request(heldout[0][0]), timeout=30)
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert _counted(s) == {("Generate", "UNAUTHENTICATED"): 1}
