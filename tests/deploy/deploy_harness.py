"""Harness for tests/deploy, where the deploy files run for real: `seqserve serve` processes configured as the
containers configure them (SEQSERVE_* variables), Debian's nginx and prometheus on the repository's own configs
rendered for 127.0.0.1.

Docker Hub is unreachable, so images are never built or pulled in tests; everything else in deploy/ is run or
validated. The external tools are Debian packages that .ci/run installs: under CI=true a missing one fails.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import grpc
from ports import free_port
from prometheus_client.parser import text_string_to_metric_families

from seqserve.client.healthcheck import check
from seqserve.v1 import seqserve_pb2 as pb
from seqserve.v1 import seqserve_pb2_grpc as pb_grpc

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
LOOPBACK = "127.0.0.1"


def wait_until(predicate, timeout: float, what: str, poll: float = 0.05) -> None:
    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(poll)


class Replica:
    """One `seqserve serve` process on 127.0.0.1, configured only through SEQSERVE_* variables, as a container is."""

    def __init__(self, bundle: Path, log_dir: Path, name: str, **settings) -> None:
        self.name, self.port, self.metrics_port = name, free_port(), free_port()
        env = {"SEQSERVE_BUNDLE": str(bundle), "SEQSERVE_BIND": LOOPBACK, "SEQSERVE_PORT": str(self.port),
               "SEQSERVE_METRICS_BIND": LOOPBACK, "SEQSERVE_METRICS_PORT": str(self.metrics_port),
               "SEQSERVE_DEVICE": "cpu", "SEQSERVE_INTRA_OP_THREADS": "1", "SEQSERVE_ALLOW_SPINNING": "false",
               "SEQSERVE_GRACE_SECONDS": "15", "SEQSERVE_LOG_LEVEL": "WARNING"}
        env |= {f"SEQSERVE_{key.upper()}": str(value) for key, value in settings.items()}
        self.log = log_dir / f"{name}.log"
        with self.log.open("w") as out:
            self.process = subprocess.Popen([sys.executable, "-m", "seqserve.cli", "serve"], stdout=out,
                                            stderr=subprocess.STDOUT, env=os.environ | env)
        self.address = f"{LOOPBACK}:{self.port}"
        self.channel = grpc.insecure_channel(self.address)
        self.stub = pb_grpc.GenerationStub(self.channel)

    def wait_ready(self, timeout: float = 60) -> Replica:
        def serving() -> bool:
            if self.process.poll() is not None:
                raise AssertionError(f"{self.name} exited {self.process.returncode}: {self.log.read_text()}")
            return check(self.address, timeout=1) == "SERVING"

        wait_until(serving, timeout, f"{self.name} to serve", poll=0.1)
        return self

    def metrics(self) -> dict[tuple, float]:
        """Every sample of its /metrics: {(name, (label, value), ...): value}."""
        url = f"http://{LOOPBACK}:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as reply:
            text = reply.read().decode()
        return {(s.name, *sorted(s.labels.items())): s.value
                for family in text_string_to_metric_families(text) for s in family.samples}

    def count(self, name: str, **labels) -> float:
        """The sum of the samples with these labels (whatever their other labels: every metric has `model`)."""
        return sum(value for (sample, *pairs), value in self.metrics().items()
                   if sample == name and set(labels.items()) <= set(pairs))

    def terminate(self, timeout: float = 60) -> int:
        """SIGTERM, as `docker stop` and Kubernetes send it; returns the exit code once drained."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout)

    def close(self) -> None:
        self.channel.close()
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)


def start_replicas(bundle: Path, log_dir: Path, settings: list[dict]) -> list[Replica]:
    """Starts them together (loading overlaps) and waits until each serves."""
    replicas = [Replica(bundle, log_dir, f"replica-{i}", **s) for i, s in enumerate(settings)]
    try:
        for replica in replicas:
            replica.wait_ready()
    except BaseException:
        for replica in replicas:
            replica.close()
        raise
    return replicas


def heldout_inputs(bundle: Path, n: int) -> list[str]:
    lines = (bundle / "heldout.tsv").read_text().splitlines()
    return [line.split("\t")[0] for line in lines[:n]]


def generate_text(stub, text: str, timeout: float = 30) -> str:
    return stub.Generate(pb.GenerateRequest(input=text), timeout=timeout).text


def stream_text(stub, text: str, timeout: float = 30) -> str:
    return "".join(piece.text for piece in stub.GenerateStream(pb.GenerateRequest(input=text), timeout=timeout))
