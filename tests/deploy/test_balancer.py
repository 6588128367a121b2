"""deploy/nginx/nginx.conf, live: Debian's nginx balancing two real `seqserve serve` replicas on 127.0.0.1.

The tests run in file order on one stack; the last one stops a replica.
"""
from __future__ import annotations

import csv
import re
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest
import yaml
from deploy_harness import (
    DEPLOY,
    LOOPBACK,
    ROOT,
    generate_text,
    heldout_inputs,
    start_replicas,
    stream_text,
    wait_until,
)
from external_tools import require
from ports import free_port
from raw_grpc import unary

from seqserve.client.healthcheck import check
from seqserve.v1 import seqserve_pb2 as pb
from seqserve.v1 import seqserve_pb2_grpc as pb_grpc

CONF = DEPLOY / "nginx" / "nginx.conf"
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
# The upstream lines of the repository's config: compose names with `resolve` (nginx >= 1.27.3, newer than Debian's).
SERVER_LINE = re.compile(r"^(\s*)server (\S+):50051 resolve (.*?);.*$", re.M)
UNARY, STREAMS, THREADS = 200, 50, 8
GENERATE_PATH = "/seqserve.v1.Generation/Generate"


def render(conf: str, listen_port: int, upstreams: list[int], workdir: Path) -> str:
    """The repository's config with local ports and files; everything else (upstream parameters, keepalive,
    grpc_* directives) is kept as it is."""
    servers = SERVER_LINE.findall(conf)
    assert [name for _, name, _ in servers] == ["seqserve", "seqserve-gpu"], servers
    indent, _, params = servers[0]
    local = "".join(f"{indent}server {LOOPBACK}:{port} {params};\n" for port in upstreams)
    conf = SERVER_LINE.sub(lambda m: local.rstrip("\n") if m.group(2) == "seqserve" else "", conf)
    for old, new in ((r"listen 50051 http2;", f"listen {LOOPBACK}:{listen_port} http2;"),
                     (r"pid /tmp/nginx.pid;", f"pid {workdir}/nginx.pid;"),
                     (r"error_log /dev/stderr warn;", f"error_log {workdir}/error.log warn;"),
                     (r"http {", "http {\n" + "".join(f"    {kind}_temp_path {workdir}/{kind};\n" for kind in
                                                      ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")))):
        assert conf.count(old) == 1, f"{old!r} is no longer in {CONF}"
        conf = conf.replace(old, new)
    return conf


class Balancer:
    def __init__(self, upstreams: list[int], workdir: Path) -> None:
        nginx = require("nginx")
        self.port = free_port()
        self.conf = workdir / "nginx.conf"
        self.conf.write_text(render(CONF.read_text(), self.port, upstreams, workdir))
        command = [nginx, "-p", str(workdir), "-c", str(self.conf), "-e", str(workdir / "error.log")]
        tested = subprocess.run([*command, "-t"], capture_output=True, text=True, timeout=30)
        assert tested.returncode == 0, tested.stderr
        self.process = subprocess.Popen([*command, "-g", "daemon off;"], stderr=subprocess.PIPE, text=True)
        self.address = f"{LOOPBACK}:{self.port}"
        wait_until(lambda: check(self.address, timeout=1) == "SERVING", 30, "nginx to pass health checks")
        self.channel = grpc.insecure_channel(self.address)
        self.stub = pb_grpc.GenerationStub(self.channel)

    def close(self) -> None:
        self.channel.close()
        self.process.terminate()
        self.process.wait(10)


@pytest.fixture(scope="module")
def stack(tiny_bundle, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("nginx")
    replicas = start_replicas(tiny_bundle, workdir, [{}, {}])
    balancer = None
    try:
        balancer = Balancer([r.port for r in replicas], workdir)
        yield replicas, balancer
    finally:
        if balancer is not None:
            balancer.close()
        for replica in replicas:
            replica.close()


@pytest.fixture(scope="module")
def inputs(tiny_bundle, stack) -> dict[str, str]:
    """Held-out inputs and each one's output from a direct call to one replica (greedy: the same everywhere)."""
    replica = stack[0][0]
    return {text: generate_text(replica.stub, text) for text in heldout_inputs(tiny_bundle, 40)}


def _calls(stub, inputs: dict[str, str], retried: dict | None = None) -> list[tuple[str, str, str]]:
    """UNARY + STREAMS calls from THREADS threads: [(kind, input, output)]. A call answered with a status code
    that is a key of `retried` is recorded there and sent again (none is, without it)."""
    texts = list(inputs)
    every = (UNARY + STREAMS) // STREAMS  # one stream among every `every` calls
    jobs = [("stream" if i % every == every - 1 else "unary", texts[i % len(texts)]) for i in range(UNARY + STREAMS)]
    call = {"unary": generate_text, "stream": stream_text}

    def one(job):
        kind, text = job
        for _ in range(20):
            try:
                return kind, text, call[kind](stub, text)
            except grpc.RpcError as exc:
                if exc.code() not in (retried or {}):
                    raise
                retried[exc.code()].append(exc.details())
                time.sleep(0.05)
        raise AssertionError(f"{kind} call still failing after 20 tries")

    with ThreadPoolExecutor(THREADS) as pool:
        return list(pool.map(one, jobs))


def _served(replica) -> dict[str, float]:
    return {method: replica.count("seqserve_requests_total", method=method, code="OK")
            for method in ("Generate", "GenerateStream")}


def test_every_call_is_balanced_and_answers_as_a_direct_call(stack, inputs):
    replicas, balancer = stack
    before = [_served(r) for r in replicas]
    results = _calls(balancer.stub, inputs)
    after = [_served(r) for r in replicas]
    assert [(kind, output) for kind, text, output in results] == [(kind, inputs[text]) for kind, text, _ in results]
    served = [{m: a[m] - b[m] for m in a} for a, b in zip(after, before, strict=True)]
    assert sum(s["Generate"] for s in served) == UNARY and sum(s["GenerateStream"] for s in served) == STREAMS
    shares = [sum(s.values()) / (UNARY + STREAMS) for s in served]
    print(f"\nshare per replica of {UNARY} unary + {STREAMS} streaming calls through nginx: "
          + ", ".join(f"{r.name} {share:.1%} ({s})" for r, share, s in zip(replicas, shares, served, strict=True)))
    # Per-call balancing over one client connection: round robin gives each about half (per connection, one).
    assert min(shares) >= 0.3, shares


def test_the_deadline_reaches_the_replica(stack, inputs):
    _, balancer = stack
    text = next(iter(inputs))
    # 32 inputs x 30 tokens take far longer than 2 ms even on a fast machine: the client's own timer decides first
    with pytest.raises(grpc.RpcError) as caught:  # what every gRPC client sees
        balancer.stub.GenerateBatch(pb.GenerateBatchRequest(inputs=[text] * 32, options=pb.DecodingOptions(
            max_new_tokens=30, min_new_tokens=30)), timeout=0.002)
    assert caught.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
    # A client that sends grpc-timeout without enforcing it: DEADLINE_EXCEEDED can only come from the replica.
    request = pb.GenerateRequest(input=text, options=pb.DecodingOptions(max_new_tokens=30, min_new_tokens=30))
    expired = unary(LOOPBACK, balancer.port, GENERATE_PATH, request.SerializeToString(), [("grpc-timeout", "1m")])
    assert expired.status == grpc.StatusCode.DEADLINE_EXCEEDED.value[0], expired
    unbounded = unary(LOOPBACK, balancer.port, GENERATE_PATH, request.SerializeToString(), [])
    assert unbounded.status == 0, unbounded  # the same call without a deadline completes
    assert len(pb.GenerateResponse.FromString(unbounded.body).token_ids) == 30


def _locust(service: str, replace: dict[str, str], extra: list[str], log) -> subprocess.Popen:
    """A compose locust service's command, run by this Python with local addresses and paths."""
    command = [replace.get(arg, arg) for arg in COMPOSE["services"][service]["command"]]
    return subprocess.Popen([sys.executable, "-m", "locust", *command, *extra], stdout=log, stderr=subprocess.STDOUT)


def test_locust_master_and_worker_of_the_loadtest_profile_load_the_balancer(stack, tiny_bundle, tmp_path):
    replicas, balancer = stack
    before = [sum(_served(r).values()) for r in replicas]
    master_port = free_port()
    replace = {"/app/loadtest/locustfile.py": str(ROOT / "loadtest" / "locustfile.py"), "nginx:50051": balancer.address,
               "/artifacts/bundle": str(tiny_bundle), "locust-master": LOOPBACK}
    log = (tmp_path / "locust.log").open("w")
    master = _locust("locust-master", replace, ["--headless", "--users", "4", "--spawn-rate", "4", "--run-time", "3s",
                                                "--expect-workers", "1", "--master-bind-host", LOOPBACK,
                                                "--master-bind-port", str(master_port),
                                                "--csv", str(tmp_path / "locust")], log)
    worker = _locust("locust-worker", replace, ["--master-port", str(master_port)], log)
    try:
        assert master.wait(120) == 0, (tmp_path / "locust.log").read_text()
        assert worker.wait(60) == 0, (tmp_path / "locust.log").read_text()
    finally:
        for process in (master, worker):
            if process.poll() is None:
                process.kill()
        log.close()
    with (tmp_path / "locust_stats.csv").open() as f:
        calls = [row for row in csv.DictReader(f) if row["Type"] == "grpc"]  # whole calls (not the ttft rows)
    requests, failures = (sum(int(row[column]) for row in calls) for column in ("Request Count", "Failure Count"))
    assert requests > 0 and failures == 0
    served = [sum(_served(r).values()) - b for r, b in zip(replicas, before, strict=True)]
    assert sum(served) == requests and min(served) > 0, (served, requests)  # every call via nginx, to both


def test_sigterm_to_a_replica_under_load_loses_no_call(stack, inputs):
    replicas, balancer = stack
    stopping, remaining = replicas[0], replicas[1]
    done, exit_code = [], []
    # The only answer a call may get besides its output: UNAVAILABLE from the draining replica (nginx sees an HTTP
    # 200 carrying grpc-status 14, so the client retries it, as gRPC clients should).
    retried = {grpc.StatusCode.UNAVAILABLE: []}

    def stop_when_a_quarter_is_done():
        wait_until(lambda: len(done) >= (UNARY + STREAMS) // 4, 60, "a quarter of the calls")
        exit_code.append(stopping.terminate())

    stopper = threading.Thread(target=stop_when_a_quarter_is_done)
    stopper.start()
    results = _calls(_CountingStub(balancer.stub, lambda: done.append(1)), inputs, retried)
    stopper.join(60)
    assert exit_code == [0], stopping.log.read_text()  # drained and exited cleanly
    assert "grace period" not in stopping.log.read_text()  # no call was still in flight when the grace ran out
    assert [output for _, _, output in results] == [inputs[text] for _, text, _ in results]  # none lost, none wrong
    (unavailable,) = retried.values()
    print(f"\nSIGTERM to {stopping.name} after {(UNARY + STREAMS) // 4} of {UNARY + STREAMS} calls: 0 lost, "
          f"{len(unavailable)} answered UNAVAILABLE by the draining replica and retried by the client to success")
    assert set(unavailable) <= {"the server is shutting down"}
    assert check(remaining.address) == "SERVING"
    assert check(balancer.address) == "SERVING"  # nginx now sends everything to the remaining replica


class _CountingStub:
    """The balancer's stub, calling `on_done` after each successful call (the SIGTERM waits for a quarter)."""

    def __init__(self, stub, on_done) -> None:
        self._stub, self._on_done = stub, on_done

    @property
    def Generate(self):
        def call(request, timeout=None):
            reply = self._stub.Generate(request, timeout=timeout)
            self._on_done()
            return reply
        return call

    @property
    def GenerateStream(self):
        def call(request, timeout=None):
            yield from self._stub.GenerateStream(request, timeout=timeout)
            self._on_done()
        return call
