"""--front-ends 2 with --engine-process, at fault: a real `seqserve serve` (the CLI) and what goes wrong around it.

- Another server on the port: a second --front-ends server for another model fails with "address already in use"
  (as one without --front-ends does) and the first's connections all reach the first; so does a server started
  while any socket with SO_REUSEPORT (gRPC's default) holds the port, or while another server claims it.
- An attached front end that cannot attach (engines.json corrupt, the engine's socket file removed): one line that
  says why, no traceback, the restart back-off; a drain (SIGTERM) within its bound meanwhile.
- kill -9 of the first front end: its processes leave, and so do both private directories.
"""
from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from ports import free_port
from serve_process import SERVING, START, WAIT, ServeProcess, cmdline, engine_address, environ, generate, until

from seqserve.server.front_ends import ROLE
from seqserve.server.port_claim import CLAIM_NAME

IN_USE = "address already in use"
BACKOFF = re.compile(r"front end 1 \(pid \d+\) [^\n]*: starting it again in (\d+) s")
DRAIN_BOUND = 30.0  # seconds from SIGTERM to exit while a front end cannot attach: Kubernetes' default grace




def _refused(args: list[str], tmp_path: Path, name: str) -> str:
    """Runs `seqserve serve ARGS`, which must exit non-zero; its output."""
    done = subprocess.run([sys.executable, "-m", "seqserve.cli.main", "serve", *args], capture_output=True, text=True,
                          timeout=WAIT, check=False)
    (tmp_path / f"{name}.log").write_text(done.stdout + done.stderr)
    assert done.returncode != 0, done.stderr[-3000:]
    return done.stderr


@pytest.fixture
def served(tiny_bundle, tmp_path):
    """--front-ends 2 on --port 0: the first picks a port, and its other front end listens on that one too."""
    serve = ServeProcess(["--bundle", str(tiny_bundle), "--engine-process", "--front-ends", "2", "--port", "0",
                          "--metrics-port", "-1", "--intra-op-threads", "1"], tmp_path / "serve.log")
    try:
        port = serve.wait_serving(2)
        assert {int(p) for _, p in SERVING.findall(serve.log())} == {port}
        yield serve, port
    finally:
        serve.kill()


def test_a_second_front_ends_server_on_the_port_fails_with_address_in_use(served, tiny_bundle, tmp_path, heldout):
    serve, port = served
    other = ["--bundle", f"other={tiny_bundle}", "--engine-process", "--front-ends", "2", "--port", str(port),
             "--metrics-port", "-1", "--intra-op-threads", "1"]
    assert IN_USE in _refused(other, tmp_path, "other")
    assert IN_USE in _refused([*other[:3], *other[5:]], tmp_path, "plain").lower()  # as without --front-ends
    first = generate(port, heldout[0][0])
    for _ in range(12):  # fresh connections: each reaches one of this server's own front ends
        again = generate(port, heldout[0][0])
        assert (again.text, list(again.token_ids)) == (first.text, list(first.token_ids))
        with pytest.raises(grpc.RpcError) as err:
            generate(port, heldout[0][0], model="other")
        assert err.value.code() == grpc.StatusCode.NOT_FOUND


def test_a_port_held_with_so_reuseport_or_claimed_is_refused(tiny_bundle, tmp_path):
    """A gRPC server of this user (SO_REUSEPORT is gRPC's default) holds the port: a --front-ends server refuses to
    join it. Another --front-ends server claims a port (the instant before it binds): a second one refuses it."""
    port = free_port()
    args = ["--bundle", str(tiny_bundle), "--engine-process", "--front-ends", "2", "--port", str(port),
            "--metrics-port", "-1"]
    holder = grpc.server(futures.ThreadPoolExecutor(1))
    assert holder.add_insecure_port(f"127.0.0.1:{port}") == port
    holder.start()
    try:
        assert IN_USE in _refused(args, tmp_path, "held")
    finally:
        holder.stop(0)
    with socket.socket(socket.AF_UNIX) as claim:
        claim.bind("\0" + CLAIM_NAME.format(port=port))
        assert f"another seqserve server with front ends listens on port {port}" in _refused(args, tmp_path, "claim")


def _attached(serve: ServeProcess) -> tuple[int, Path]:
    """The attached front end's pid and its engines.json (from its environment: INDEX:PORT:PATH)."""
    [front] = serve.fronts()
    return front, Path(environ(front)[ROLE].split(":", 2)[2])


def _failures(serve: ServeProcess, why: str, since: int, count: int = 2) -> None:
    """Waits (from log offset `since`: the kill) for the attached front end to fail `count` times for this reason,
    each logged as one line, no traceback, and the restarts spaced by a growing back-off."""
    until(lambda: serve.log()[since:].count(why) >= count, f"{count} failures logged: {why}", START)
    until(lambda: len(BACKOFF.findall(serve.log()[since:])) > count, "the restarts after them", START)
    delays = [int(d) for d in BACKOFF.findall(serve.log()[since:])]
    assert delays == sorted(delays) and delays[-1] > delays[0], delays
    assert "Traceback" not in serve.log()


def test_a_front_end_that_cannot_attach_says_why_backs_off_and_drains_in_time(served, heldout):
    serve, port = served
    front, engines = _attached(serve)
    written = engines.read_text()
    engines.write_text("{not json")  # what a disk full, or a hand, leaves
    since = len(serve.log())
    os.kill(front, signal.SIGKILL)
    _failures(serve, f"{engines} is corrupt (not JSON", since)
    engines.write_text(written)  # mended: the next start attaches and serves
    until(lambda: serve.log().count(" serving tiny-bundle on ") >= 3, "the attached front end serving again", START)

    front, _ = _attached(serve)
    socket_file = engine_address(serve.engines()[0]).removeprefix("ipc://")
    os.unlink(socket_file)  # as a cleaner of /tmp does
    since = len(serve.log())
    os.kill(front, signal.SIGKILL)
    _failures(serve, f"its engine's socket {socket_file} is gone", since)
    assert generate(port, heldout[0][0]).token_ids  # the first front end serves on meanwhile
    began = time.monotonic()
    serve.proc.send_signal(signal.SIGTERM)
    assert serve.proc.wait(WAIT) == 0
    assert time.monotonic() - began < DRAIN_BOUND and "did not drain" not in serve.log()


def test_a_killed_first_front_end_leaves_no_directory_behind(served):
    serve, _ = served
    front, engines = _attached(serve)
    [engine] = serve.engines()
    sockets = Path(engine_address(engine).removeprefix("ipc://")).parent
    assert engines.parent.is_dir() and sockets.is_dir()
    serve.proc.kill()
    serve.proc.wait()
    until(lambda: not cmdline(front) and not cmdline(engine), "the attached front end and the engine process gone")
    assert not engines.parent.exists() and not sockets.exists()

