"""A real `seqserve serve --engine-process` (the console script, as a user starts it) whose engine process is stopped
(SIGSTOP), killed (kill -9) or signalled with its process group, and the server's own early SIGTERM.

What each test holds (docs/security.md, "The engine process"): the queue limit holds whatever the engine does; a
silent engine makes its model not ready (health, seqserve_model_ready) and is killed and restarted past the bounds
set by flags, its calls ending UNAVAILABLE with a message that says so, counted in seqserve_engine_restarts_total;
a killed engine's model is not ready until its successor is; a signal to the whole group drains as a signal to the
server does; a drain ends within its bound while the engine is stopped.

No timing windows: the bounds are flags set small, every wait polls a state with a generous bound (WAIT), and the
engine is held by SIGSTOP, never by sleeping.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest
from grpc_harness import follow_log, request
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families
from serve_process import children, cmdline, until

from seqserve.v1 import seqserve_pb2_grpc as pb_grpc

SEQSERVE = Path(sys.executable).parent / "seqserve"
WAIT = 60.0  # every wait is bounded: a hang fails the test instead of blocking the suite
MODEL = "tiny"
HEALTH_NAME = f"seqserve.v1.Generation/{MODEL}"
LONG = dict(min_new_tokens=38, max_new_tokens=38)  # 38 steps (the bundle allows 40)
SERVING, NOT_SERVING = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING
ENGINE = "seqserve.engine.remote.engine_process"


def _gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] in "ZX"  # reaped or a zombie
    except OSError:
        return True


class Server:
    """`seqserve serve --engine-process` in a session of its own (a process group the test may signal)."""

    def __init__(self, bundle: Path, *flags: str, front_ends: int = 1) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SEQSERVE_")}
        self.proc = subprocess.Popen(
            [str(SEQSERVE), "serve", "--bundle", f"{MODEL}={bundle}", "--engine-process", "--port", "0",
             "--metrics-port", "0", "--device", "cpu", "--intra-op-threads", "1", "--front-ends", str(front_ends),
             *flags],
            env=env, stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            self._started(front_ends)
        except BaseException:
            self.close()
            raise

    def _started(self, front_ends: int) -> None:
        self.channel = None
        self.log, ports, listening = follow_log(self.proc)
        until(lambda: listening.is_set() or self.proc.poll() is not None, "serving")
        assert self.proc.poll() is None, self.text
        self.port = ports[0]
        found = lambda: re.findall(r"metrics on 127\.0\.0\.1:(\d+)/metrics", self.text)  # noqa: E731
        self.metrics_ports = [int(p) for p in until(lambda: len(found()) == front_ends and found(), "every /metrics")]
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.port}")
        self.stub = pb_grpc.GenerationStub(self.channel)
        self.health_stub = health_pb2_grpc.HealthStub(self.channel)

    @property
    def text(self) -> str:
        return "".join(self.log)

    def engine_pid(self) -> int:
        """The engine process serving now (waits for one)."""
        def find():
            pids = [c for c in children(self.proc.pid) if ENGINE in cmdline(c) and not _gone(c)]
            return pids[0] if len(pids) == 1 else None
        return until(find, "one engine process")

    def health(self, service: str = HEALTH_NAME) -> int:
        return self.health_stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=10).status

    def metric(self, name: str, **labels) -> float:
        """Summed over the front ends."""
        total = 0.0
        for port in self.metrics_ports:
            text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
            total += sum(s.value for family in text_string_to_metric_families(text) for s in family.samples
                         if s.name == name and set(labels.items()) <= set(s.labels.items()))
        return total

    def close(self) -> None:
        if self.channel is not None:
            self.channel.close()
        if self.proc.poll() is None:
            for child in children(self.proc.pid):
                os.kill(child, signal.SIGKILL)
            self.proc.kill()
        self.proc.wait(WAIT)


@pytest.fixture
def serve(tiny_bundle):
    servers: list[Server] = []

    def start(*flags: str, front_ends: int = 1) -> Server:
        servers.append(Server(tiny_bundle, *flags, front_ends=front_ends))
        return servers[-1]

    yield start
    for s in servers:
        s.close()


@pytest.fixture(scope="module")
def source(heldout) -> str:
    return heldout[0][0]


def _code(future) -> grpc.StatusCode:
    try:
        future.result(0)
        return grpc.StatusCode.OK
    except grpc.RpcError as e:
        return e.code()


def test_a_stopped_engine_keeps_the_queue_limit(serve, source):
    """The engine is stopped with nothing queued: the front end holds what the engine itself can hold
    (max_batch_size + max_waiting = 6) and every further call gets RESOURCE_EXHAUSTED at once, as in-process."""
    s = serve("--max-batch-size", "2", "--max-waiting", "4", "--max-batch-inputs", "4",
              "--engine-not-ready-seconds", "600", "--engine-restart-seconds", "1200")
    pid = s.engine_pid()
    os.kill(pid, signal.SIGSTOP)
    try:
        calls = [s.stub.Generate.future(request(source, max_new_tokens=4), timeout=WAIT) for _ in range(40)]
        until(lambda: sum(c.done() for c in calls) >= 34, "34 calls answered while the engine is stopped")
        refused = [c for c in calls if c.done()]
        assert len(refused) == 34 and {_code(c) for c in refused} == {grpc.StatusCode.RESOURCE_EXHAUSTED}
        assert "max_batch_size + max_waiting" in refused[0].exception().details()
        assert s.metric("seqserve_rejected_requests_total", model=MODEL, reason="queue_full") == 34
    finally:
        os.kill(pid, signal.SIGCONT)
    held = [c for c in calls if c not in refused]
    until(lambda: all(c.done() for c in held), "the held calls answered once the engine goes on")
    codes = [_code(c) for c in held]  # the engine refuses what its own queue cannot take when it reads them all
    assert set(codes) <= {grpc.StatusCode.OK, grpc.StatusCode.RESOURCE_EXHAUSTED}
    assert codes.count(grpc.StatusCode.OK) >= 4, codes


def test_a_silent_engine_is_not_ready_then_killed_and_restarted(serve, source):
    """SIGSTOP: past --engine-not-ready-seconds the model is NOT_SERVING, model_ready 0 and new calls UNAVAILABLE;
    past --engine-restart-seconds the engine is killed and started again, calls without a deadline end UNAVAILABLE
    saying why, the restart is counted as hung, and the model serves again."""
    s = serve("--engine-not-ready-seconds", "3", "--engine-restart-seconds", "6")
    want = s.stub.Generate(request(source), timeout=WAIT)
    pid = s.engine_pid()
    os.kill(pid, signal.SIGSTOP)
    with ThreadPoolExecutor(2) as pool:
        undeadlined = [pool.submit(s.stub.Generate, request(source, **LONG)) for _ in range(2)]  # no deadline
        _every_call_held(s, 2, source)  # before the bound: they arrived while the model was ready
        until(lambda: s.health() == NOT_SERVING, "NOT_SERVING")
        assert s.metric("seqserve_model_ready", model=MODEL) == 0
        assert s.health("") == SERVING  # the server itself serves: only this model's engine is silent
        with pytest.raises(grpc.RpcError) as refused:
            s.stub.Generate(request(source), timeout=WAIT)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE and "answered nothing" in refused.value.details()
        for call in undeadlined:
            with pytest.raises(grpc.RpcError) as ended:
                call.result(WAIT)
            assert ended.value.code() == grpc.StatusCode.UNAVAILABLE
            assert "restarted" in ended.value.details() and "retried" in ended.value.details(), ended.value.details()
    assert until(lambda: _gone(pid), "the silent engine killed")
    until(lambda: s.health() == SERVING, "SERVING again")
    assert s.engine_pid() != pid
    assert s.metric("seqserve_engine_restarts_total", model=MODEL, cause="hung") == 1
    assert s.metric("seqserve_model_ready", model=MODEL) == 1
    after = s.stub.Generate(request(source), timeout=WAIT)
    assert (list(after.token_ids), after.text) == (list(want.token_ids), want.text)


def _stop_the_next_engine(s: Server, old: int) -> int:
    """The engine started after `old` died, stopped before it could say HELLO: it has not mapped onnxruntime yet,
    and it loads its model (onnxruntime) before it says HELLO. None if it was already further."""
    pid = until(lambda: (p := s.engine_pid()) != old and p, "a new engine process")
    os.kill(pid, signal.SIGSTOP)
    if "onnxruntime_pybind11_state" in Path(f"/proc/{pid}/maps").read_text():
        os.kill(pid, signal.SIGCONT)
        return None
    return pid


def test_a_killed_engine_leaves_its_model_not_ready_until_its_successor_serves(serve, source):
    """kill -9: the call it held ends UNAVAILABLE saying the engine was killed and is restarting; until the new engine
    serves, the model is NOT_SERVING, model_ready 0, and a call hears that the engine is restarting; the restart is
    counted as killed."""
    s = serve("--engine-not-ready-seconds", "600", "--engine-restart-seconds", "1200")
    for attempt in range(1, 4):  # the new engine must be caught before its HELLO (it loads for a while first)
        old = s.engine_pid()
        os.kill(old, signal.SIGSTOP)
        held = s.stub.Generate.future(request(source, **LONG), timeout=WAIT)
        until(lambda: s.metric("seqserve_inflight_request_bytes") > 0, "the call in flight")
        os.kill(old, signal.SIGKILL)
        with pytest.raises(grpc.RpcError) as ended:
            held.result(WAIT)
        assert ended.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "was killed by a signal" in ended.value.details() and "restarted" in ended.value.details()
        if (new := _stop_the_next_engine(s, old)) is not None:
            break
        until(lambda: s.health() == SERVING, "SERVING again")
    else:
        pytest.fail("the new engine was never caught before its HELLO")
    try:
        until(lambda: s.health() == NOT_SERVING, "NOT_SERVING during the restart")
        assert s.metric("seqserve_model_ready", model=MODEL) == 0
        assert s.metric("seqserve_engine_restarts_total", model=MODEL, cause="killed") == attempt
        with pytest.raises(grpc.RpcError) as refused:
            s.stub.Generate(request(source), timeout=WAIT)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        assert f"the engine of model '{MODEL}' is restarting" in refused.value.details(), refused.value.details()
        assert "the server stopped" not in refused.value.details()
    finally:
        os.kill(new, signal.SIGCONT)
    until(lambda: s.health() == SERVING, "SERVING once the new engine serves")
    assert s.metric("seqserve_model_ready", model=MODEL) == 1
    assert s.stub.Generate(request(source), timeout=WAIT).token_ids


def _every_call_held(s: Server, calls: int, text: str) -> None:
    size = request(text, **LONG).ByteSize()
    until(lambda: s.metric("seqserve_inflight_request_bytes") == calls * size, f"{calls} calls in flight")


@pytest.mark.parametrize("how, front_ends", [("SIGINT to the group", 1), ("SIGTERM to every process", 1),
                                             ("SIGINT to the group", 2)])
def test_a_signal_to_the_whole_group_drains_as_one_to_the_server(serve, source, how, front_ends):
    """Ctrl-C signals the process group; systemd's KillMode=control-group signals every process of the service. The
    engine ignores both and is stopped by its server, which drains (another front end drains as it would when told):
    every call in flight finishes OK, the server exits 0, no traceback, no engine or front end restarted."""
    s = serve("--grace-seconds", "60", "--engine-not-ready-seconds", "600", "--engine-restart-seconds", "1200",
              front_ends=front_ends)
    pid = s.engine_pid()
    os.kill(pid, signal.SIGSTOP)  # holds the calls in flight while the signal arrives
    channels = [grpc.insecure_channel(f"127.0.0.1:{s.port}") for _ in range(8)]  # connections reach every front end
    with ThreadPoolExecutor(8) as pool:
        calls = [pool.submit(pb_grpc.GenerationStub(c).Generate, request(source, **LONG), timeout=WAIT)
                 for c in channels]
        try:
            _every_call_held(s, 8, source)
            if how == "SIGINT to the group":
                os.killpg(s.proc.pid, signal.SIGINT)
            else:
                for target in (s.proc.pid, pid):
                    os.kill(target, signal.SIGTERM)
            until(lambda: "draining" in s.text, "the drain")
        finally:
            os.kill(pid, signal.SIGCONT)  # a signal it ignores is dropped, not delivered now
        answers = [c.result(WAIT) for c in calls]
    for c in channels:
        c.close()
    assert all(len(a.token_ids) == LONG["max_new_tokens"] for a in answers)
    assert s.proc.wait(WAIT) == 0, s.text
    until(lambda: re.search(r" seqserve: stopped$", s.text, re.M), "the server's last log line")
    assert "Traceback" not in s.text and "KeyboardInterrupt" not in s.text, s.text
    assert "restarting it" not in s.text and "starting it again" not in s.text and _gone(pid), s.text


def test_a_drain_with_a_stopped_engine_ends_within_its_bound(serve, source):
    """SIGTERM while the engine is stopped with calls in flight: the calls end UNAVAILABLE after --grace-seconds and
    the server exits 0 within grace + backlog + the fixed steps (docs/security.md), whatever the engine does."""
    grace, backlog = 2.0, 1.0
    s = serve("--grace-seconds", str(grace), "--drain-backlog-seconds", str(backlog))
    pid = s.engine_pid()
    os.kill(pid, signal.SIGSTOP)
    with ThreadPoolExecutor(4) as pool:
        calls = [pool.submit(s.stub.Generate, request(source, **LONG), timeout=WAIT) for _ in range(4)]
        _every_call_held(s, 4, source)
        start = time.monotonic()
        s.proc.send_signal(signal.SIGTERM)
        code = s.proc.wait(WAIT)
        took = time.monotonic() - start
        for call in calls:
            with pytest.raises(grpc.RpcError) as ended:
                call.result(WAIT)
            assert ended.value.code() == grpc.StatusCode.UNAVAILABLE
    assert code == 0, s.text
    assert took < grace + backlog + 6.0, f"the drain took {took:.1f} s"  # without the bound: 2 + 5 + 1 + 1 + 15 s
    assert until(lambda: _gone(pid), "the stopped engine killed")
