"""--front-ends 2 with --engine-process: a real `seqserve serve` (the CLI, as a user starts it) whose two gRPC front-end
processes share one port (SO_REUSEPORT) and one engine process. Many connections reach both front ends (each counts
its own calls on its own /metrics); every answer is the same; a killed engine process ends its calls UNAVAILABLE on
either front end and both attach to its successor; SIGTERM drains every process and each exits."""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request

import grpc
import pytest
from ports import free_port
from prometheus_client.parser import text_string_to_metric_families

from seqserve.client.healthcheck import check
from seqserve.contract.manifest import MANIFEST, sha256_of
from seqserve.contract.verified import VERIFIED
from seqserve.v1 import seqserve_pb2 as pb
from seqserve.v1 import seqserve_pb2_grpc as pb_grpc

WAIT = 60.0
CONNECTIONS = 24  # each its own channel: SO_REUSEPORT spreads connections, not calls (all on one: 2 ** -23)


def _children(pid: int) -> list[int]:
    found = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as f:
            found += [int(c) for c in f.read().split()]
    return found


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _until(condition, what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not condition():
        assert time.monotonic() < deadline, f"not {what} within {WAIT} s"
        time.sleep(0.05)


def _calls_ok(metrics_port: int) -> float:
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read().decode()
    except OSError:
        return -1.0
    return sum(s.value for family in text_string_to_metric_families(text) for s in family.samples
               if s.name == "seqserve_requests_total" and s.labels.get("method") == "Generate"
               and s.labels.get("code") == "OK")


def _spread(address: str, text: str, model: str = "") -> list:
    """One Generate on each of CONNECTIONS fresh connections."""
    answers = []
    for _ in range(CONNECTIONS):  # a local subchannel pool: a new connection each, never a shared one reused
        with grpc.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)]) as channel:
            call = pb.GenerateRequest(input=text, model=model)
            answers.append(pb_grpc.GenerationStub(channel).Generate(call, timeout=WAIT))
    return answers


@contextlib.contextmanager
def _serving(models: list[str], tmp_path, serving: str):
    """`seqserve serve MODELS --engine-process --front-ends 2` until both front ends log `serving`."""
    port, metrics = free_port(), free_port()
    while metrics + 1 == port:
        metrics = free_port()
    log = open(tmp_path / "serve.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "seqserve.cli.main", "serve", *models, "--port", str(port),
                             "--metrics-port", str(metrics), "--engine-process", "--front-ends", "2",
                             "--intra-op-threads", "1", "--log-level", "INFO"], stdout=log, stderr=subprocess.STDOUT)
    try:
        address = f"127.0.0.1:{port}"
        _until(lambda: check(address, timeout=1.0) == "SERVING", "serving")
        _until(lambda: (tmp_path / "serve.log").read_text().count(f" serving {serving} on ") == 2,
               "both front ends serving (each logs it once it listens)")
        yield proc, address, metrics, tmp_path / "serve.log"
    finally:
        if proc.poll() is None:
            for child in _children(proc.pid):
                os.kill(child, signal.SIGKILL)
            proc.kill()
        proc.wait()
        log.close()


@pytest.fixture
def served(tiny_bundle, tmp_path):
    with _serving(["--bundle", str(tiny_bundle)], tmp_path, "tiny-bundle") as s:
        yield s


def test_two_front_ends_share_the_port_and_the_engine(served, heldout):
    proc, address, metrics, log = served
    text = heldout[0][0]
    answers = _spread(address, text)
    assert {(a.text, tuple(a.token_ids)) for a in answers} == {(answers[0].text, tuple(answers[0].token_ids))}
    assert answers[0].token_ids
    first, second = _calls_ok(metrics), _calls_ok(metrics + 1)
    assert first > 0 and second > 0 and first + second == CONNECTIONS  # both front ends served, each counted its own

    children = {pid: _cmdline(pid) for pid in _children(proc.pid)}
    [engine] = [pid for pid, cmd in children.items() if "seqserve.engine.remote.engine_process" in cmd]
    [front] = [pid for pid, cmd in children.items() if "seqserve.cli.main serve" in cmd]
    os.kill(engine, signal.SIGKILL)  # both front ends' calls on it end; both attach to the one started after it
    _until(lambda: any("seqserve.engine.remote.engine_process" in _cmdline(p) for p in _children(proc.pid)),
           "a new engine process")

    def all_answer() -> bool:
        try:
            again = _spread(address, text)
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.UNAVAILABLE, e  # only while a front end attaches again
            return False
        assert {(a.text, tuple(a.token_ids)) for a in again} == {(answers[0].text, tuple(answers[0].token_ids))}
        return True

    _until(all_answer, "both front ends answering through the new engine")
    assert _calls_ok(metrics) > first and _calls_ok(metrics + 1) > second

    proc.send_signal(signal.SIGTERM)
    assert proc.wait(WAIT) == 0
    _until(lambda: not _cmdline(front) and not any("engine_process" in _cmdline(p) for p in children), "all gone")
    assert "front end 1 started" in log.read_text()


def test_a_reload_reaches_every_front_end(tiny_bundle, tmp_path, heldout):
    """SIGHUP to the server: the first front end loads the added model (its own engine process), then passes the
    reload on; the other attaches to that engine, and both answer for the new model."""
    repository = tmp_path / "models"
    for name in ("a", "b"):
        shutil.copytree(tiny_bundle, repository / name)
        (repository / name / VERIFIED).write_text(json.dumps({"manifest_sha256": sha256_of(tiny_bundle / MANIFEST)}))
    shutil.move(repository / "b", tmp_path / "b")  # not there yet
    with _serving(["--model-repository", str(repository)], tmp_path, "a") as (proc, address, metrics, log):
        shutil.move(tmp_path / "b", repository / "b")
        proc.send_signal(signal.SIGHUP)
        _until(lambda: log.read_text().count("reload done: serving a, b") == 2, "both front ends reloaded")
        answers = _spread(address, heldout[0][0], model="b")
        assert len({(a.text, tuple(a.token_ids)) for a in answers}) == 1 and answers[0].token_ids
        assert _calls_ok(metrics) > 0 and _calls_ok(metrics + 1) > 0  # both front ends answered for b
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(WAIT) == 0


def test_a_dead_front_end_is_started_again_and_all_leave_with_the_first(served, heldout):
    """kill -9 of the other front end: the first starts it again and it serves; kill -9 of the first: the other
    drains and exits, and the engine process exits on its lifeline (no process is left)."""
    proc, address, metrics, log = served
    [front] = [p for p in _children(proc.pid) if "seqserve.cli.main serve" in _cmdline(p)]
    os.kill(front, signal.SIGKILL)
    _until(lambda: log.read_text().count(" serving tiny-bundle on ") == 3, "the other front end serving again")
    [again] = [p for p in _children(proc.pid) if "seqserve.cli.main serve" in _cmdline(p)]
    assert again != front and "front end 1 (pid" in log.read_text()
    before = _calls_ok(metrics + 1)
    _until(lambda: _spread(address, heldout[0][0]) and _calls_ok(metrics + 1) > before, "it answering calls")
    children = _children(proc.pid)
    proc.kill()
    proc.wait()
    _until(lambda: not any(_cmdline(p) for p in children), "the other front end and the engine process gone")
