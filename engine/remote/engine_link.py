"""A front end's link to one engine process: the one it started (Spawned, watched through a lifeline socket pair) or
one another front end started (Attached, watched through its socket's disconnect events; server/front_ends.py).

Either way the link has the DEALER socket to the engine (HELLO sent), something to poll that becomes readable when
the engine is gone (`watch`), and close().
"""
from __future__ import annotations

import logging
import secrets
import select
import signal
import socket
import subprocess
import sys
import time

import zmq

from seqserve.engine.api import EngineInfo
from seqserve.engine.build import EngineConfig
from seqserve.engine.limits import Limits
from seqserve.engine.remote import wire
from seqserve.engine.remote.engine_process import Launch
from seqserve.engine.remote.wire import HELLO

log = logging.getLogger("seqserve.engine.remote.remote_engine")
SECRET_BYTES = 32  # a STOP carries this many random bytes: only the front end that started an engine stops it
EXIT_SECONDS = 2.0  # an engine whose lifeline ended (it is exiting) finishes exiting within this, or is killed


def exit_cause(code: int) -> str:
    """How a process ended, from its exit status, for the log."""
    if code < 0:
        return f"was killed by {signal.Signals(-code).name}"
    return f"exited with status {code}" + (" (its log above says why)" if code else "")


def _dealer(ctx: zmq.Context, address: str, identity: bytes) -> zmq.Socket:
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.IDENTITY, identity)
    for option, value in ((zmq.LINGER, 0), (zmq.SNDHWM, 0), (zmq.RCVHWM, 0), (zmq.RECONNECT_IVL, 10)):
        sock.setsockopt(option, value)
    sock.connect(address)  # before the engine binds: ZeroMQ connects once it does
    sock.send_multipart([HELLO, wire.dumps(None)])
    return sock


class Spawned:
    """An engine process this front end started: its end of the lifeline reads end-of-file when the process dies."""

    def __init__(self, ctx: zmq.Context, cfg: EngineConfig, address: str, identity: bytes, limits: Limits,
                 cpus: str = "") -> None:
        """limits: the requests' limits the engine checks each ADD against (the server's, for this model)."""
        self.secret = secrets.token_bytes(SECRET_BYTES)  # on stdin, never in argv (readable by every user)
        ours, theirs = socket.socketpair()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "seqserve.engine.remote.engine_process", "--address", address,
             "--lifeline", str(theirs.fileno()), "--cpus", cpus,
             "--log-level", logging.getLevelName(log.getEffectiveLevel())],  # it logs as much as the server does
            stdin=subprocess.PIPE, pass_fds=(theirs.fileno(),),
            process_group=0)  # Ctrl-C and kill -- -PGID signal the server's group: the server stops its engines
        theirs.close()
        try:
            self.process.stdin.write(wire.dumps(Launch(cfg, limits, self.secret)))
            self.process.stdin.close()
        except BrokenPipeError:  # it died at once: its lifeline says so
            pass
        self.lifeline, self.address = ours, address
        self.watch = ours.fileno()
        self.sock = _dealer(ctx, address, identity)
        self.started = time.monotonic()
        self.up = False

    @property
    def name(self) -> str:
        return f"engine process {self.process.pid}"

    def close(self, kill: bool) -> int:
        """Its exit status (killed first if `kill` and still running; but one whose lifeline ended is exiting, and is
        given EXIT_SECONDS to finish, so that its status says how it ended rather than that it was killed)."""
        self.sock.close(linger=0)
        if kill and self.process.poll() is None and self._lifeline_ended():
            try:
                self.process.wait(EXIT_SECONDS)
            except subprocess.TimeoutExpired:
                pass
        self.lifeline.close()
        if kill and self.process.poll() is None:
            self.process.kill()
        return self.process.wait()

    def _lifeline_ended(self) -> bool:
        if not select.select([self.lifeline], [], [], 0)[0]:
            return False
        try:
            return self.lifeline.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True


class Attached:
    """An engine process another front end started and supervises: this one only connects to it. Its socket's
    monitor reports the disconnect when that engine goes away."""

    process = None

    def __init__(self, ctx: zmq.Context, address: str, identity: bytes) -> None:
        self.address = address
        self.sock = _dealer(ctx, address, identity)
        self.watch = self.sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        self.started = time.monotonic()
        self.up = False

    @property
    def name(self) -> str:
        return f"the engine at {self.address}"

    def close(self, kill: bool) -> None:
        self.sock.disable_monitor()
        self.watch.close(linger=0)
        self.sock.close(linger=0)


def hello(engine: Spawned | Attached, seconds: float, bundle) -> EngineInfo:
    """Waits for the engine's HELLO (it loads and warms up its model first): its EngineInfo."""
    poller = zmq.Poller()
    poller.register(engine.sock, zmq.POLLIN)
    poller.register(engine.watch, zmq.POLLIN)
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        events = dict(poller.poll(left * 1000))
        if engine.sock in events:
            kind, payload = engine.sock.recv_multipart()
            if kind == HELLO:
                engine.up = True
                return wire.loads(EngineInfo, payload)
        elif events:
            raise RuntimeError(f"{engine.name} for {bundle} went away (exit status {engine.close(kill=False)}) "
                               "before it was ready (its log is above)")
    engine.close(kill=True)
    raise RuntimeError(f"the engine process for {bundle} was not ready within {seconds:.0f} s")
