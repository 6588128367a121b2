"""The whole gRPC server with `serve --engine-process` (settings.engine_process): real servers on the tiny bundle, a
real channel, each model's engine in a process of its own (engine/remote/remote_engine.py,
engine/remote/engine_process.py).

The oracle is an in-process server on the same bundle and settings (its answers to the same requests) and the
bundle's tokenizer; nothing expected comes from the engine process.

Where a test needs the engine to hold a request, it stops the engine process (SIGSTOP) and waits until the front
end holds the call's request and handed its commands to the socket (RemoteEngine.held, RemoteEngine.sent): the
engine reads them all when it goes on (SIGCONT). Every wait is on a state and bounded (WAIT): a hang fails the test.
"""
from __future__ import annotations

import json
import logging
import os
import select
import shutil
import signal
import stat
import subprocess
import sys
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest
from grpc_harness import Served, default_limits, request, wait_for
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from seqserve.contract.integrity import open_bundle
from seqserve.contract.manifest import MANIFEST, sha256_of
from seqserve.contract.verified import VERIFIED
from seqserve.engine.build import EngineConfig
from seqserve.engine.remote.remote_engine import RemoteEngine
from seqserve.engine.runtime.device import RuntimeConfig
from seqserve.v1 import seqserve_pb2 as pb

WAIT = 30.0  # every wait is bounded: a hang fails the test instead of blocking the suite
LONG = dict(min_new_tokens=38, max_new_tokens=38)  # 38 steps (the bundle allows 40): still running when acted on
SERVING = health_pb2.HealthCheckResponse.SERVING


@pytest.fixture(scope="module")
def local(tiny_bundle):
    """The oracle: the same bundle served with the engine in the server's own process."""
    s = Served(tiny_bundle).wait_ready()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def remote(tiny_bundle):
    """The server under test: its engine in a process of its own."""
    s = Served(tiny_bundle, engine_process=True).wait_ready()
    assert isinstance(s.model.engine, RemoteEngine)
    yield s
    s.stop()


@pytest.fixture
def make_remote(tiny_bundle):
    """A private engine-process server with its own settings (stopped at the end of the test)."""
    servers = []

    def make(**overrides) -> Served:
        s = Served(overrides.pop("bundle", tiny_bundle), engine_process=True, **overrides).wait_ready()
        servers.append(s)
        return s

    yield make
    for s in servers:
        s.stop()


@pytest.fixture(scope="module")
def sources(heldout) -> list[str]:
    return sorted({s for s, _ in heldout}, key=len)[-6:]  # the longest: streams of several pieces


def _engine(s: Served) -> RemoteEngine:
    return s.model.engine


def _holds(engine: RemoteEngine) -> set[int]:
    with engine.held.lock:  # add() registers and queues its requests under this lock
        return set(engine.held.ids)


def _stop_engine(s: Served) -> tuple[RemoteEngine, int, int]:
    """Stops the engine process (SIGSTOP); the front end still takes calls. (engine, its pid, commands sent so far)."""
    engine = _engine(s)
    pid = engine.process.pid
    os.kill(pid, signal.SIGSTOP)
    return engine, pid, engine.sent


def _hold(engine: RemoteEngine, sent: int, n: int = 1) -> set[int]:
    """Waits until the front end holds n requests and handed their adds to the socket; their ids."""
    wait_for(lambda: len(_holds(engine)) >= n and engine.sent >= sent + n, WAIT, f"{n} requests held")
    return _holds(engine)


def _scrape(s: Served) -> dict[tuple[str, frozenset], float]:
    """/metrics over HTTP, as Prometheus reads it: (sample name, its labels) -> value."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{s.app.metrics_port}/metrics", timeout=10).read().decode()
    return {(sample.name, frozenset(sample.labels.items())): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def _metric(scraped: dict, name: str, **labels) -> float:
    return sum(v for (n, have), v in scraped.items() if n == name and set(labels.items()) <= have)


def _health(s: Served) -> int:
    stub = health_pb2_grpc.HealthStub(s.channel)
    return stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=10).status


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def _engine_children() -> list[int]:
    """This process's child processes that are engine processes (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (entry / "cmdline").read_bytes()
        except (OSError, IndexError, ValueError):
            continue  # it exited meanwhile
        if ppid == os.getpid() and b"seqserve.engine.remote.engine_process" in cmdline:
            found.append(int(entry.name))
    return found


def test_generation_answers_what_the_in_process_server_answers(local, remote, sources):
    """Generate, GenerateStream (its pieces add up to the unary answer), GenerateBatch, beams with
    num_return_sequences and GetModelInfo: the engine-process server answers each as the in-process one does."""
    for src in sources[:3]:
        want, have = local.stub.Generate(request(src), timeout=WAIT), remote.stub.Generate(request(src), timeout=WAIT)
        assert (list(have.token_ids), have.text, have.finish_reason, have.usage) == (
            list(want.token_ids), want.text, want.finish_reason, want.usage)
        assert have.token_ids  # the comparison compared tokens
        pieces = list(remote.stub.GenerateStream(request(src), timeout=WAIT))
        assert "".join(p.text for p in pieces) == have.text
        assert [t for p in pieces for t in p.token_ids] == list(have.token_ids)
        assert pieces[-1].finish_reason == have.finish_reason and pieces[-1].usage == have.usage
    batch = pb.GenerateBatchRequest(inputs=sources, options=pb.DecodingOptions(max_new_tokens=20))
    want, have = local.stub.GenerateBatch(batch, timeout=WAIT), remote.stub.GenerateBatch(batch, timeout=WAIT)
    assert [(list(r.token_ids), r.text, r.finish_reason) for r in have.results] == [
        (list(r.token_ids), r.text, r.finish_reason) for r in want.results]
    assert len(have.results) == len(sources)
    beams = request(sources[0], max_new_tokens=12, num_beams=3, num_return_sequences=2)
    want, have = local.stub.Generate(beams, timeout=WAIT), remote.stub.Generate(beams, timeout=WAIT)
    assert len(have.sequences) == 2
    assert [(list(q.token_ids), q.text, q.finish_reason) for q in have.sequences] == [
        (list(q.token_ids), q.text, q.finish_reason) for q in want.sequences]
    assert [q.score for q in have.sequences] == pytest.approx([q.score for q in want.sequences])
    info = pb.GetModelInfoRequest()
    want, have = local.stub.GetModelInfo(info, timeout=WAIT), remote.stub.GetModelInfo(info, timeout=WAIT)
    assert have.execution_provider == want.execution_provider and have.variant == want.variant
    assert have == want


def test_returned_ids_decode_to_the_returned_text(remote, sources, tiny_bundle):
    """The second oracle: the bundle's own tokenizer, in this process, decodes the ids the engine process returned."""
    tokenizer = open_bundle(tiny_bundle)[1]
    for src in sources[:3]:
        r = remote.stub.Generate(request(src), timeout=WAIT)
        assert r.text == tokenizer.decode(list(r.token_ids), skip_special_tokens=True) and r.token_ids
        assert r.usage.input_tokens == len(tokenizer.encode(src).ids)


def test_the_engine_process_figures_reach_metrics(make_remote, sources):
    """The engine's step figures cross the process boundary: /metrics counts the call's tokens, its finish and the
    decoder steps."""
    s = make_remote()
    before = _scrape(s)
    r = s.stub.Generate(request(sources[-1]), timeout=WAIT)
    after = _scrape(s)  # the response comes after its report's figures were applied (server/outbox.py)

    def grew(name: str, **labels) -> float:
        return _metric(after, name, **labels) - _metric(before, name, **labels)

    assert r.usage.generated_tokens == len(r.token_ids) > 0
    assert grew("seqserve_generated_tokens_total") == r.usage.generated_tokens
    assert grew("seqserve_input_tokens_total") == r.usage.input_tokens > 0
    reason = pb.FinishReason.Name(r.finish_reason).removeprefix("FINISH_REASON_").lower()
    assert grew("seqserve_finished_requests_total", reason=reason) == 1
    assert grew("seqserve_decoder_step_duration_seconds_count") > 0
    assert grew("seqserve_requests_total", method="Generate", code="OK") == 1


def test_a_full_queue_answers_resource_exhausted(make_remote, sources):
    """max_batch_size=1, max_waiting=1: with the engine stopped, four calls are sent; the front end holds the two
    the engine itself could hold (max_batch_size + max_waiting) and refuses the others at once; when the engine goes
    on it reads both adds, takes the first and refuses what does not fit with "queue full" (RESOURCE_EXHAUSTED, counted
    as queue_full); the calls it took complete."""
    s = make_remote(max_batch_size=1, max_waiting=1, max_batch_inputs=1)
    engine, pid, sent = _stop_engine(s)
    with ThreadPoolExecutor(4) as pool:
        try:
            calls = [pool.submit(s.stub.Generate, request(src, **LONG), timeout=WAIT) for src in sources[:4]]
            _hold(engine, sent, n=2)
        finally:
            os.kill(pid, signal.SIGCONT)
        done, refused = [], []
        for call in calls:
            try:
                done.append(call.result(WAIT))
            except grpc.RpcError as e:
                assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "queue full" in e.details(), e
                refused.append(e)
    assert done and refused  # the first add always fits; the second finds the one waiting place taken
    assert all(len(r.token_ids) == LONG["max_new_tokens"] for r in done)
    assert s.metric("seqserve_rejected_requests_total", reason="queue_full") == len(refused)
    assert not _holds(engine)  # the front end holds none of them any more
    r = s.stub.Generate(request(sources[0]), timeout=WAIT)  # the queue is free again
    assert r.token_ids


def test_a_killed_engine_ends_its_calls_unavailable_and_comes_back(make_remote, sources):
    """kill -9 of the engine process during a stream: the call ends UNAVAILABLE at once (never hangs), the front
    end starts a new engine process, and the next call succeeds.

    The server's health ("") stays SERVING: it says whether this front end takes calls, and it does; its model's
    name is NOT_SERVING until the engine is back (tests/server/test_engine_faults.py). A call that arrives while the
    engine restarts ends UNAVAILABLE at once (as the killed ones do), which clients retry. The first restart follows
    at once (RESTART_DELAYS[0] == 0); only a crash loop waits longer."""
    s = make_remote()
    want = s.stub.Generate(request(sources[1]), timeout=WAIT)
    engine, pid, sent = _stop_engine(s)
    stream = s.stub.GenerateStream(request(sources[0], **LONG), timeout=WAIT)
    try:
        _hold(engine, sent)
    finally:
        os.kill(pid, signal.SIGKILL)
    with pytest.raises(grpc.RpcError) as ended:
        list(stream)  # bounded: the call's own deadline is WAIT
    assert ended.value.code() == grpc.StatusCode.UNAVAILABLE, ended.value
    assert _health(s) == SERVING
    assert engine.wait_up(WAIT) and engine.process.pid != pid and _gone(pid)
    after = s.stub.Generate(request(sources[1]), timeout=WAIT)
    assert (list(after.token_ids), after.text) == (list(want.token_ids), want.text) and after.token_ids
    assert _health(s) == SERVING


def test_drain_finishes_the_calls_and_the_engine_process_exits_0(tiny_bundle, sources):
    """The SIGTERM drain (App.drain) with a call in flight: the call completes, the drain ends cleanly, the engine
    process exits 0 and leaves nothing behind (no process, no socket directory); stopping it again is harmless."""
    s = Served(tiny_bundle, engine_process=True).wait_ready()
    try:
        engine = _engine(s)
        socket_dir, process = engine._dir, engine.process
        assert stat.S_IMODE(os.stat(socket_dir).st_mode) == 0o700  # only the serving user reaches the socket
        want = s.stub.Generate(request(sources[0]), timeout=WAIT)
        engine, pid, sent = _stop_engine(s)
        call = s.stub.Generate.future(request(sources[0]), timeout=WAIT)
        try:
            _hold(engine, sent)
            drained = s.run_async(s.app.drain())
            wait_for(lambda: s.app.service.draining, WAIT, "the drain")
        finally:
            os.kill(pid, signal.SIGCONT)
        r = call.result(WAIT)
        assert (list(r.token_ids), r.text) == (list(want.token_ids), want.text)
        assert drained.result(WAIT + 10) is True  # every call finished within the grace period
    finally:
        s.stop()  # after a drain: only ends the event loop
    assert process.returncode == 0
    assert _gone(pid) and pid not in _engine_children()
    assert not Path(socket_dir).exists()
    assert engine.stop() is True  # a second stop (App.close after the drain) answers as the first did
    engine.abort(1)  # a late abort of a call's row finds nothing to end, and no error


def test_a_cancelled_stream_ends_its_request_in_the_engine(remote, sources):
    """A client that cancels its stream: the front end aborts the request and the engine process ends it CANCELLED
    (its finished counter counts `cancelled`); the engine is free for the next call."""
    before = remote.metric("seqserve_finished_requests_total", reason="cancelled")
    engine, pid, sent = _stop_engine(remote)
    stream = remote.stub.GenerateStream(request(sources[0], **LONG), timeout=WAIT)
    try:
        [held] = _hold(engine, sent)
        stream.cancel()
        wait_for(lambda: engine.sent >= sent + 2, WAIT, "the abort handed to the engine's socket")
    finally:
        os.kill(pid, signal.SIGCONT)
    with pytest.raises(grpc.RpcError) as ended:
        list(stream)
    assert ended.value.code() == grpc.StatusCode.CANCELLED
    wait_for(lambda: remote.metric("seqserve_finished_requests_total", reason="cancelled") > before, WAIT,
             "the engine's end of the cancelled request")
    remote.settle()
    assert remote.metric("seqserve_finished_requests_total", reason="cancelled") == before + 1
    assert held not in _holds(engine)
    assert remote.stub.Generate(request(sources[1]), timeout=WAIT).token_ids


@pytest.mark.parametrize("level", [logging.WARNING, logging.INFO])
def test_the_engine_process_logs_at_the_server_level(tiny_bundle, capfd, caplog, level):
    """`serve --log-level WARNING --engine-process` keeps the engine processes' INFO lines out of its log too."""
    caplog.set_level(level, logger="seqserve")
    engine = RemoteEngine(EngineConfig(tiny_bundle, runtime=RuntimeConfig(device="cpu", intra_op_threads=1)),
                          limits=default_limits(tiny_bundle))
    try:
        pid = engine.process.pid
    finally:
        assert engine.stop(WAIT)
    said = [line for line in capfd.readouterr().err.splitlines() if f"engine[{pid}] INFO" in line]
    assert bool(said) == (level == logging.INFO), said


def _alive(pid: int) -> bool:
    """Whether the process runs (a zombie waiting for its reaper has exited)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def test_a_front_end_that_dies_takes_its_engine_with_it(tiny_bundle):
    """kill -9 of the process that started an engine process: the engine reads end-of-file on its lifeline, drains
    and exits, rather than live on alone, and removes the socket directory its dead front end left."""
    front = subprocess.Popen(
        [sys.executable, "-c", "import sys\n"
         "from seqserve.engine.build import EngineConfig\n"
         "from seqserve.engine.runtime.device import RuntimeConfig\n"
         "from seqserve.engine.remote.remote_engine import RemoteEngine\n"
         "from seqserve.contract.manifest import load_manifest\n"
         "from seqserve.server.model_defaults import model_limits\n"
         "from seqserve.server.settings import Settings\n"
         "limits = model_limits(Settings(bundle=sys.argv[1]), load_manifest(sys.argv[1], check_files=False))\n"
         "e = RemoteEngine(EngineConfig(sys.argv[1], runtime=RuntimeConfig(device='cpu', intra_op_threads=1)),\n"
         "                 limits=limits)\n"
         "e.start(lambda report: None)\n"
         "print(e.process.pid, e._dir, flush=True)\n"
         "sys.stdin.read()\n", str(tiny_bundle)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert select.select([front.stdout], [], [], WAIT)[0], "the front end's engine did not start"
        pid, socket_dir = front.stdout.readline().split()
        pid = int(pid)
        assert Path(socket_dir).is_dir()
        assert _alive(pid)
        front.kill()
        front.wait(WAIT)
        wait_for(lambda: not _alive(pid), WAIT, "the engine process to exit")
        assert not Path(socket_dir).exists()  # nothing of the two is left in the temporary directory
    finally:
        if front.poll() is None:
            front.kill()
            front.wait(WAIT)


def test_a_deadline_that_passes_ends_the_request_in_the_engine_as_deadline(remote, sources):
    """The call's deadline passes while the engine process is held: the client gets DEADLINE_EXCEEDED, the front end
    aborts the request as a deadline, and the engine process counts its finish `deadline`."""
    before = remote.metric("seqserve_finished_requests_total", reason="deadline")
    engine, pid, sent = _stop_engine(remote)
    stream = remote.stub.GenerateStream(request(sources[0], **LONG), timeout=1.0)
    try:
        _hold(engine, sent)
        with pytest.raises(grpc.RpcError) as ended:
            list(stream)  # ends when its deadline passes: the engine is stopped
        assert ended.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        wait_for(lambda: engine.sent >= sent + 2, WAIT, "the abort handed to the engine's socket")
    finally:
        os.kill(pid, signal.SIGCONT)
    wait_for(lambda: remote.metric("seqserve_finished_requests_total", reason="deadline") == before + 1, WAIT,
             "the engine's deadline finish counted")
    assert not _holds(engine)


def test_a_reload_starts_an_engine_process_for_a_new_model_and_stops_a_removed_one(make_remote, tiny_bundle,
                                                                                   tmp_path, sources):
    """A model repository served with --engine-process: a model added on reload gets an engine process of its own
    and answers; a removed one drains and its engine process exits; the other keeps answering."""
    repository = tmp_path / "models"
    for name in ("a", "b"):
        shutil.copytree(tiny_bundle, repository / name)
        (repository / name / VERIFIED).write_text(json.dumps({"manifest_sha256": sha256_of(tiny_bundle / MANIFEST)}))
    shutil.move(repository / "b", tmp_path / "b")  # not there yet
    s = make_remote(bundle=None, model_repository=repository)
    a_pid = s.app.models["a"].engine.process.pid
    want = s.stub.Generate(request(sources[0]), timeout=WAIT)
    shutil.move(tmp_path / "b", repository / "b")
    s.run_async(s.app.reload()).result(120)
    assert s.app.models.keys() == {"a", "b"}
    b_pid = s.app.models["b"].engine.process.pid
    assert b_pid != a_pid and not _gone(b_pid)
    for name in ("a", "b"):
        got = s.stub.Generate(pb.GenerateRequest(input=sources[0], model=name), timeout=WAIT)
        assert (got.text, list(got.token_ids)) == (want.text, list(want.token_ids))
    shutil.rmtree(repository / "a")
    s.run_async(s.app.reload()).result(120)
    assert s.app.models.keys() == {"b"}
    wait_for(lambda: _gone(a_pid), WAIT, "the removed model's engine process gone")
    got = s.stub.Generate(pb.GenerateRequest(input=sources[0], model="b"), timeout=WAIT)
    assert (got.text, list(got.token_ids)) == (want.text, list(want.token_ids))
