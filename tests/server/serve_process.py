"""A real `seqserve serve` process for the fault suites (test_engine_wire_faults.py, test_front_end_faults.py): started
as a user starts it (the CLI), its log in a file, its processes found through /proc. Every wait is bounded."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc

from seqserve.v1 import seqserve_pb2 as pb
from seqserve.v1 import seqserve_pb2_grpc as pb_grpc

WAIT = 60.0
START = 180.0  # a server loads and warms up its model and starts its processes within this, on a busy machine too
ENGINE = "seqserve.engine.remote.engine_process"
FRONT = "seqserve.cli.main serve"
SERVING = re.compile(r" serving (\S+) on [^ ]+:(\d+) \(")


def children(pid: int) -> list[int]:
    found = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                found += [int(c) for c in f.read().split()]
    except OSError:  # gone
        pass
    return found


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def environ(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/environ", "rb") as f:
        pairs = [item.decode().partition("=") for item in f.read().split(b"\0") if item]
    return {k: v for k, _, v in pairs}


def until(condition, what: str, wait: float = WAIT):
    """The condition's first true value, polled until `wait` seconds have passed."""
    deadline = time.monotonic() + wait
    while not (value := condition()):
        assert time.monotonic() < deadline, f"not {what} within {wait} s"
        time.sleep(0.02)
    return value


def engine_address(engine_pid: int) -> str:
    """The ZeroMQ address an engine process binds (its --address)."""
    args = cmdline(engine_pid).split()
    return args[args.index("--address") + 1]


class ServeProcess:
    """`seqserve serve ARGS --log-level INFO`, its log (stdout and stderr) in log_path."""

    def __init__(self, args: list[str], log_path: Path) -> None:
        self.log_path = log_path
        with open(log_path, "a") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "seqserve.cli.main", "serve", *args,
                                          "--log-level", "INFO"], stdout=log, stderr=subprocess.STDOUT)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        return self.log_path.read_text()

    def wait_serving(self, count: int = 1) -> int:
        """Once `count` front ends logged that they serve; the port they listen on."""
        until(lambda: len(SERVING.findall(self.log())) >= count or self.proc.poll() is not None, "serving", START)
        assert self.proc.poll() is None, f"exited {self.proc.returncode}:\n{self.log()[-3000:]}"
        return int(SERVING.findall(self.log())[0][1])

    def engines(self) -> list[int]:
        return [p for p in children(self.pid) if ENGINE in cmdline(p)]

    def fronts(self) -> list[int]:
        """The attached front ends (--front-ends N: the first starts them)."""
        return [p for p in children(self.pid) if FRONT in cmdline(p)]

    def kill(self) -> None:
        """kill -9 of the server and of every process it started (a test's cleanup)."""
        for child in children(self.pid):
            os.kill(child, signal.SIGKILL)
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def generate(port: int, text: str, model: str = "") -> pb.GenerateResponse:
    """One Generate on a fresh connection."""
    with grpc.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.use_local_subchannel_pool", 1)]) as channel:
        return pb_grpc.GenerationStub(channel).Generate(pb.GenerateRequest(input=text, model=model), timeout=WAIT)
