"""A gRPC server process for a benchmark: started from its argv (taskset pins it), awaited until its health service
says SERVING, stopped with SIGTERM. `seqserve serve` and the bare servicer are both run so."""
from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import tempfile
import time

from seqserve.client.healthcheck import check

STOP_TIMEOUT_S = 60.0  # after SIGTERM; then it is killed


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def launched(argv: list[str], address: str, startup_timeout_s: float):
    """Runs argv until it answers SERVING at address; yields its process id (taskset execs: the server's own)."""
    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + startup_timeout_s
            while check(address, timeout=1.0) != "SERVING":
                if proc.poll() is not None or time.monotonic() > deadline:
                    log.seek(0)
                    raise RuntimeError(f"the server did not come up: {log.read()[-2000:]}")
                time.sleep(0.2)
            yield proc.pid
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
