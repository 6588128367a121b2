"""The engine process's socket, from a second process: a real `seqserve serve --engine-process` (the CLI) whose engine
process this test reaches as any process of the same user can, with a ZeroMQ socket of its own (a Forger).

Malformed frames are logged and dropped, out-of-range options are refused with an ERROR naming the field, a STOP
without the starting front end's secret is dropped; after each the same engine process (same pid) answers a HELLO,
which it reads after the frame (one connection's frames are read in order), and the server still answers. An engine
process that dies of an exception is logged with its real exit status and its cause; the socket directory of a
server killed during an engine's restart back-off is swept when the next server starts.
"""
from __future__ import annotations

import dataclasses
import math
import os
import shutil
import signal
import uuid
from pathlib import Path

import msgpack
import pytest
import zmq
from serve_process import WAIT, ServeProcess, engine_address, generate, until

from seqserve.contract.integrity import open_bundle
from seqserve.engine.api import EngineRequest, StepReport
from seqserve.engine.remote import wire
from seqserve.engine.remote.wire import ABORT, ADD, HELLO, REPORT, STOP
from seqserve.engine.request import FinishReason, SamplingParams

DROPPED = "dropped a malformed message"


class Forger:
    """A DEALER of another process on an engine process's socket."""

    def __init__(self, address: str) -> None:
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.IDENTITY, f"forger-{uuid.uuid4().hex}".encode())
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(address)

    def send(self, *frames: bytes) -> None:
        self.sock.send_multipart(list(frames))

    def receive(self, kind: bytes) -> bytes:
        """The payload of the next message of this kind (others are skipped); fails after WAIT seconds."""
        while self.sock.poll(WAIT * 1000):
            got, payload = self.sock.recv_multipart()
            if got == kind:
                return payload
        pytest.fail(f"no {kind!r} from the engine process within {WAIT} s")

    def hello(self) -> None:
        """The engine process answers, so it read every frame sent before (and lives)."""
        self.send(HELLO, wire.dumps(None))
        self.receive(HELLO)

    def close(self) -> None:
        self.sock.close()
        self.ctx.term()


@pytest.fixture(scope="module")
def server(tiny_bundle, tmp_path_factory, heldout):
    serve = ServeProcess(["--bundle", str(tiny_bundle), "--engine-process", "--port", "0", "--metrics-port", "-1",
                          "--intra-op-threads", "1"], tmp_path_factory.mktemp("wire") / "serve.log")
    try:
        port = serve.wait_serving()
        [engine] = serve.engines()
        yield serve, port, engine, generate(port, heldout[0][0])
    finally:
        serve.kill()


@pytest.fixture
def forger(server):
    f = Forger(engine_address(server[2]))
    yield f
    f.close()


def _serves_as_before(server, text: str) -> None:
    serve, port, engine, first = server
    assert serve.engines() == [engine]  # the same engine process: it neither died nor was started again
    again = generate(port, text)
    assert (again.text, list(again.token_ids)) == (first.text, list(first.token_ids))


REQUEST = EngineRequest(1, (5, 6, 2), SamplingParams(max_new_tokens=4, seed=1))
PLAIN = msgpack.unpackb(wire.dumps([REQUEST]))
MALFORMED = {
    "truncated msgpack": [ADD, wire.dumps([REQUEST])[:-3]],
    "trailing bytes": [ADD, wire.dumps([REQUEST]) + b"\x00"],
    "not msgpack": [ABORT, b"\xc1"],
    "deep nesting": [ADD, b"\x91" * 100_000 + b"\xc0"],
    "a string for the requests": [ADD, msgpack.packb("requests")],
    "a string for an id": [ADD, msgpack.packb([["1", *PLAIN[0][1:]]])],
    "a request cut short": [ADD, msgpack.packb([PLAIN[0][:3]])],
    "wrong types in an abort": [ABORT, msgpack.packb(["x", "y"])],
    "an unknown kind": [b"Q", b""],
    "one frame": [ADD],
    "three frames": [ADD, b"", b""],
}


@pytest.mark.parametrize("frames", MALFORMED.values(), ids=MALFORMED.keys())
def test_a_malformed_frame_is_dropped_and_the_engine_lives_on(server, forger, frames, heldout):
    before = server[0].log().count(DROPPED)
    forger.send(*frames)
    forger.hello()
    assert server[0].log().count(DROPPED) == before + 1
    _serves_as_before(server, heldout[0][0])


@pytest.mark.parametrize("payload", [wire.dumps(5.0), wire.dumps([5.0, b"\0" * 32])],
                         ids=["without a secret", "with a wrong secret"])
def test_a_forged_stop_is_dropped_and_the_engine_keeps_serving(server, forger, payload, heldout):
    before = server[0].log().count(DROPPED)
    forger.send(STOP, payload)
    forger.hello()
    assert server[0].log().count(DROPPED) == before + 1
    _serves_as_before(server, heldout[0][0])


OUT_OF_RANGE = [("num_beams 10^4", dict(num_beams=10**4), "options.num_beams must be in [1, "),
                ("NaN temperature", dict(temperature=math.nan), "options.temperature must be in [0, 100], got nan"),
                ("max_new_tokens 10^6", dict(max_new_tokens=10**6), "options.max_new_tokens must be in [1, "),
                ("an id outside the vocabulary", None, "input ids must be in [0, ")]


@pytest.mark.parametrize("change, words", [o[1:] for o in OUT_OF_RANGE], ids=[o[0] for o in OUT_OF_RANGE])
def test_options_out_of_range_sent_straight_to_the_engine_are_refused(server, forger, tiny_bundle, change, words,
                                                                      heldout):
    manifest, tokenizer = open_bundle(tiny_bundle)
    ids = tuple(tokenizer.encode(heldout[0][0]).ids)
    if change is None:
        ids += (int(manifest.model["vocab_size"]),)
    request = dataclasses.replace(REQUEST, input_ids=ids, params=dataclasses.replace(REQUEST.params, **(change or {})))
    forger.hello()
    forger.send(ADD, wire.dumps([request]))
    [out] = wire.loads(StepReport, forger.receive(REPORT)).outputs
    assert out.request_id == request.id and out.result.finish_reason is FinishReason.ERROR
    assert words in out.result.error
    _serves_as_before(server, heldout[0][0])  # not wedged


def test_an_engine_that_dies_of_an_exception_is_logged_with_its_cause_and_its_directory_is_swept(
        tiny_bundle, tmp_path, heldout):
    """The bundle breaks under a running server; its engine process is killed and every start after fails with an
    exception: the log says `exited with status 1` and why, not `status -9`. The server is then killed (kill -9)
    during the restart back-off, leaving its socket directory, which the next server's start removes."""
    bundle = tmp_path / "bundle"
    shutil.copytree(tiny_bundle, bundle)
    serve = ServeProcess(["--bundle", str(bundle), "--engine-process", "--port", "0", "--metrics-port", "-1",
                          "--intra-op-threads", "1"], tmp_path / "serve.log")
    try:
        serve.wait_serving()
        [engine] = serve.engines()
        folder = Path(engine_address(engine).removeprefix("ipc://")).parent
        (bundle / "manifest.json").write_text("{")  # what a half-written bundle holds
        os.kill(engine, signal.SIGKILL)
        until(lambda: "restarting it in 2 s" in serve.log(), "a second failed start")
        serve.proc.kill()  # during the back-off: no engine process lives to remove the socket directory
        serve.proc.wait()
        log = serve.log()
        assert "the engine failed and exits: " in log and "manifest.json" in log
        assert "exited with status 1 (its log above says why): its 0 requests end UNAVAILABLE; restarting it in 1 s" \
            in log and "status -9" not in log
        assert folder.is_dir()
    finally:
        serve.kill()
    after = ServeProcess(["--bundle", str(tiny_bundle), "--engine-process", "--port", "0", "--metrics-port", "-1",
                          "--intra-op-threads", "1"], tmp_path / "after.log")
    try:
        generate(after.wait_serving(), heldout[0][0])
        assert not folder.exists() and f"removed {folder}, left behind by process {serve.pid}" in after.log()
        after.proc.send_signal(signal.SIGTERM)
        assert after.proc.wait(WAIT) == 0
    finally:
        after.kill()
