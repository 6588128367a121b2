"""A stream's messages: every token reaches the client at the step that made it, and the pieces that are ready in the
same turn of the event loop go in one message, exactly as the unary answer reads (text and ids).

The engine is held between steps (StepGate) and the server's event loop is held by a callback that blocks it, so
"several steps' outputs ready at once" is an exact state, not a timing window."""
from __future__ import annotations

import contextlib
import threading

from grpc_harness import StepGate, request

from seqserve.client.client import Client
from seqserve.v1 import seqserve_pb2 as pb

N = 8  # forced: every call generates exactly this many tokens


@contextlib.contextmanager
def loop_held(s):
    """The server's event loop runs one callback that waits here: nothing on the loop moves until the block ends."""
    entered, release = threading.Event(), threading.Event()

    def block() -> None:
        entered.set()
        release.wait(60)

    s.loop.call_soon_threadsafe(block)
    assert entered.wait(30), "the event loop never ran the blocking callback"
    try:
        yield
    finally:
        release.set()


def _held_stream(make_server, source: str):
    """A private server whose engine is held after the step that admits the call and gives it its first token."""
    s = make_server()
    gate = StepGate(s.engine)  # no settle: a test here may hold the loop while the engine steps
    gate.close()
    client = Client(s.address, timeout=30)  # a token held back would end the call DEADLINE_EXCEEDED, never hang
    messages = client.stub.GenerateStream(request(source, min_new_tokens=N, max_new_tokens=N), timeout=30)
    gate.wait_held()
    return s, gate, client, messages


def _check_exact(got: list[pb.GenerateStreamResponse], unary) -> None:
    """The pieces, concatenated as the client library does, are the unary answer: text and ids."""
    assert [t for m in got for t in m.token_ids] == unary.token_ids and len(unary.token_ids) == N
    assert "".join(m.text for m in got) == unary.text == got[-1].sequences[0].text
    assert got[-1].finish_reason == pb.FINISH_REASON_LENGTH and all(not m.finish_reason for m in got[:-1])


def _unary(client: Client, source: str):
    return client.generate(source, min_new_tokens=N, max_new_tokens=N)


def test_each_step_s_token_reaches_the_client_before_the_engine_takes_another_step(make_server, heldout):
    source = heldout[0][0]
    _, gate, client, pieces = _held_stream(make_server, source)
    got = [next(pieces)]  # the first step's token, the engine held after it
    for _ in range(N - 2):
        gate.run(1)
        got.append(next(pieces))  # the token of the step just taken, the engine held again
    assert [len(m.token_ids) for m in got] == [1] * (N - 1)
    assert gate.steps == N - 1  # no message waited for a later step
    gate.open()
    got += list(pieces)
    _check_exact(got, _unary(client, source))
    client.close()


def test_steps_ready_in_one_turn_of_the_event_loop_go_in_one_message(make_server, heldout):
    source = heldout[1][0]
    s, gate, client, pieces = _held_stream(make_server, source)
    first = next(pieces)
    with loop_held(s):
        gate.run(3)  # three steps' outputs wait together for the loop's next turn
    second = next(pieces)
    assert (len(first.token_ids), len(second.token_ids)) == (1, 3)
    gate.open()
    got = [first, second, *pieces]
    assert len(got) < N  # fewer messages than tokens
    _check_exact(got, _unary(client, source))
    client.close()
