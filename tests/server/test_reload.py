"""SIGHUP re-reads the model repository under load: a real `seqserve serve` process, client loops of bounded calls
running while the test adds a model, changes it and removes another. Every call ends OK, except calls to the removed
model made after its SIGHUP (NOT_FOUND once it is gone, or UNAVAILABLE); none is CANCELLED or lost. Each step waits
on the server's own states (health, GetModelInfo, counts of finished calls), never on a sleep."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
import pytest
from grpc_harness import follow_log, wait_for
from grpc_health.v1 import health_pb2, health_pb2_grpc

from seqserve.contract.manifest import DIGEST, MANIFEST, sha256_of
from seqserve.contract.verified import VERIFIED
from seqserve.v1 import seqserve_pb2 as pb
from seqserve.v1 import seqserve_pb2_grpc as pb_grpc

REPO = Path(__file__).resolve().parents[2]
SERVICE = "seqserve.v1.Generation"
CALLS_PER_STEP = 6  # each model's loop finishes this many more calls before the next change


def _verified_copy(bundle: Path, dest: Path, max_new_tokens: int | None = None) -> None:
    """A copy of the bundle made in a hidden directory and renamed into place (as docs/deploy.md says to add one),
    marked verified; max_new_tokens changes its manifest: a new version, visible in GetModelInfo."""
    staging = dest.parent / f".{dest.name}-staging"
    shutil.copytree(bundle, staging)
    if max_new_tokens is not None:
        manifest = json.loads((staging / MANIFEST).read_text())
        manifest["max_new_tokens"] = max_new_tokens
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=2))
        (staging / DIGEST).write_text(f"{sha256_of(staging / MANIFEST)}  {MANIFEST}\n")
    (staging / VERIFIED).write_text(json.dumps({"manifest_sha256": sha256_of(staging / MANIFEST)}))
    staging.rename(dest)


class Loop(threading.Thread):
    """Bounded Generate calls to one model, one after another, each recorded with when it ended and its code."""

    def __init__(self, stub, model: str, text: str) -> None:
        super().__init__(daemon=True)
        self.stub, self.model, self.text = stub, model, text
        self.results: list[tuple[float, str]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                self.stub.Generate(pb.GenerateRequest(input=self.text, model=self.model,
                                                      options=pb.DecodingOptions(max_new_tokens=8)), timeout=60)
                code = "OK"
            except grpc.RpcError as exc:
                code = exc.code().name
            self.results.append((time.monotonic(), code))

    def finish_more(self, n: int) -> None:
        target = len(self.results) + n
        wait_for(lambda: len(self.results) >= target, timeout=120, what=f"{n} more calls to {self.model}")


def _health(stub, model: str) -> str:
    try:
        status = stub.Check(health_pb2.HealthCheckRequest(service=f"{SERVICE}/{model}"), timeout=5).status
        return health_pb2.HealthCheckResponse.ServingStatus.Name(status)
    except grpc.RpcError as exc:
        return exc.code().name  # NOT_FOUND: no such model


def test_sighup_loads_changes_and_removes_models_under_load_without_losing_a_call(tiny_bundle, heldout, tmp_path):
    repository = tmp_path / "models"
    repository.mkdir()
    _verified_copy(tiny_bundle, repository / "a")
    (repository / "unverified").mkdir()  # a bundle being copied in: not taken until its verified.json names it
    shutil.copy(tiny_bundle / MANIFEST, repository / "unverified" / MANIFEST)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SEQSERVE_")}
    proc = subprocess.Popen([sys.executable, "-m", "seqserve.cli", "serve", "--model-repository", str(repository),
                             "--bind", "127.0.0.1", "--port", "0", "--metrics-port", "-1", "--device", "cpu",
                             "--intra-op-threads", "1", "--no-allow-spinning", "--grace-seconds", "30"],
                            cwd=REPO, env=env, stderr=subprocess.PIPE, text=True)
    log, port, listening = follow_log(proc)
    loops: list[Loop] = []
    try:
        assert listening.wait(120), "".join(log)
        channel = grpc.insecure_channel(f"127.0.0.1:{port[0]}")
        stub, health = pb_grpc.GenerationStub(channel), health_pb2_grpc.HealthStub(channel)
        assert list(stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=10).models) == ["a"]
        text = heldout[0][0]
        loops = [Loop(stub, "a", text) for _ in range(2)]
        for loop in loops:
            loop.start()
        for loop in loops:
            loop.finish_more(CALLS_PER_STEP)

        _verified_copy(tiny_bundle, repository / "b")  # added
        proc.send_signal(signal.SIGHUP)
        wait_for(lambda: _health(health, "b") == "SERVING", timeout=120, what="model b serving")
        assert list(stub.GetModelInfo(pb.GetModelInfoRequest(model="b"), timeout=10).models) == ["a", "b"]
        loops += [Loop(stub, "b", text) for _ in range(2)]
        for loop in loops[2:]:
            loop.start()
        for loop in loops:
            loop.finish_more(CALLS_PER_STEP)

        (repository / "b").rename(repository / ".b-old")  # changed: the new version replaces it whole
        _verified_copy(tiny_bundle, repository / "b", max_new_tokens=20)
        proc.send_signal(signal.SIGHUP)
        wait_for(lambda: stub.GetModelInfo(pb.GetModelInfoRequest(model="b"), timeout=10).limits.max_new_tokens == 20,
                 timeout=120, what="model b's new version serving")
        for loop in loops:
            loop.finish_more(CALLS_PER_STEP)

        long = pb.DecodingOptions(min_new_tokens=40, max_new_tokens=40)
        in_flight = stub.GenerateStream(pb.GenerateRequest(input=text, model="a", options=long), timeout=60)
        first = next(in_flight)  # running on a's engine before the SIGHUP: it must finish whole
        (repository / "a").rename(repository / ".a-removed")  # removed: drains, then NOT_FOUND
        removed_at = time.monotonic()
        proc.send_signal(signal.SIGHUP)
        wait_for(lambda: _health(health, "a") == "NOT_FOUND", timeout=120, what="model a gone")
        rest = list(in_flight)
        assert len(first.token_ids) + sum(len(m.token_ids) for m in rest) == 40
        assert rest[-1].finish_reason == pb.FINISH_REASON_LENGTH
        for loop in loops:
            loop.finish_more(CALLS_PER_STEP)
        with pytest.raises(grpc.RpcError) as info:
            stub.Generate(pb.GenerateRequest(input=text, model="a"), timeout=10)
        assert info.value.code() == grpc.StatusCode.NOT_FOUND and "the models are: b" in info.value.details()
        assert list(stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=10).models) == ["b"]  # one model: no name
    finally:
        for loop in loops:
            loop.stop.set()
        for loop in loops:
            loop.join(60)
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(60)
    assert code == 0, "".join(log)
    codes = {(loop.model, c) for loop in loops for _, c in loop.results}
    assert "CANCELLED" not in {c for _, c in codes}
    assert all(c == "OK" for loop in loops if loop.model == "b" for _, c in loop.results)
    # a call that ended before the SIGHUP was sent cannot have met a removed model: every such call is OK
    late = [(t, c) for loop in loops if loop.model == "a" for t, c in loop.results if c != "OK"]
    assert all(t >= removed_at and c in ("NOT_FOUND", "UNAVAILABLE") for t, c in late), late
    assert any(c == "NOT_FOUND" for _, c in late)  # the a loops went on calling it after it was gone
    ok = sum(c == "OK" for loop in loops for _, c in loop.results)
    assert ok >= 4 * 3 * CALLS_PER_STEP - 2 * CALLS_PER_STEP, ok
    assert not any("unverified" in line and "loading" in line for line in log)
    assert any("skipped" in line and "unverified" in line for line in log)


def test_a_sighup_while_starting_is_remembered_not_fatal():
    """Before the event loop's handler exists, SIGHUP's default action would end the process: signals.hold keeps
    it for one re-read once serving, and it does not count as a stop."""
    code = ("import os, signal; from seqserve.server import signals; signals.hold(); "
            "os.kill(os.getpid(), signal.SIGHUP); assert signals.reload_asked() and not signals.received()")
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, timeout=60)
