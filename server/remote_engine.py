"""An engine in its own process, driven through the same interface as one in this process (engine/api.py).

RemoteEngine starts `python -m seqserve.server.engine_process` (its protocol is described there), takes `.info` from
its hello, and hands each StepReport to deliver, in order, from its own socket thread. add() sends and returns: a
full queue refuses the requests with Outputs that say so (engine/api.py Output.refused).

Supervision: a socket pair joins this process and the engine's; its end-of-file tells at once that the engine died
(kill -9, out of memory, a crash in onnxruntime). Every request it held then ends CANCELLED (the edge answers
UNAVAILABLE), requests added while it is down end the same way at once, and the engine is started again with the same
EngineConfig after a delay that doubles with each start that does not last (RESTART_DELAYS), so a crash loop waits.
An attached RemoteEngine (--front-ends) starts nothing: its socket's disconnect event says the engine went away, its
requests end the same way, and it attaches to the engine the first front end started in its place
(server/engine_link.py).
"""
from __future__ import annotations

import itertools
import logging
import os
import shutil
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Sequence

import zmq

from seqserve.engine import wire
from seqserve.engine.api import Deliver, EngineInfo, EngineRequest, Output, StepReport, StepStats
from seqserve.engine.build import EngineConfig
from seqserve.engine.request import FinishReason, Result
from seqserve.server import owned_dirs
from seqserve.server.engine_link import Attached, Spawned, exit_cause
from seqserve.server.engine_process import (
    ABORT,
    ADD,
    BYE,
    HELLO,
    REPORT,
    SOCKET_DIR_PREFIX,
    STOP,
    STOP_MARGIN_SECONDS,
    STOPPED,
)
from seqserve.server.mailbox import Mailbox
from seqserve.server.settings import Limits

log = logging.getLogger("seqserve.server.remote_engine")

START_SECONDS = 600.0  # an engine process loads and warms up its model within this
RESTART_DELAYS = (0.0, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0)  # after 0, 1, 2, ... starts in a row that did not last
ATTACH_RETRY_SECONDS = 0.2  # an attached front end looks this often for the engine that replaced a dead one
STABLE_SECONDS = 60.0  # an engine up this long before it died restarts at once again


def restart_delay(failures: int) -> float:
    """Seconds before the next start after `failures` starts in a row that did not last."""
    return RESTART_DELAYS[min(failures, len(RESTART_DELAYS) - 1)]


def _cancelled(ids: Sequence[int]) -> StepReport:
    """The report that ends requests an engine can no longer finish."""
    outputs = tuple(Output(i, result=Result(FinishReason.CANCELLED)) for i in ids)
    return StepReport(outputs, StepStats(finished=(FinishReason.CANCELLED.value,) * len(ids)))


class RemoteEngine:
    """api.EngineClient for an engine process this front end starts and supervises, or (attach) one that another
    front end started (server/front_ends.py)."""

    def __init__(self, cfg: EngineConfig, start_seconds: float = START_SECONDS, cpus: str = "",
                 attach: Callable[[], str | None] | None = None, limits: Limits | None = None) -> None:
        """attach: instead of starting an engine process, connect to the one another front end started; it gives that
        engine's address (None while it has none), asked again when it went away. limits: those requests keep."""
        self.cfg, self.cpus, self._attach, self.limits = cfg, cpus, attach, limits
        self.on_up: Callable[[str], None] | None = None  # an engine this one started (again) serves at this address
        self._dir = str(owned_dirs.make(SOCKET_DIR_PREFIX)) if attach is None else None  # 0700: this user only
        self._ctx = zmq.Context()
        self._identity = f"front-{os.getpid()}-{uuid.uuid4().hex}".encode()
        self._starts = itertools.count(1)
        self._commands = Mailbox()  # the caller's add, abort and stop, to the socket thread
        self._lock = threading.Lock()
        self._held: set[int] = set()  # ids added and not yet ended
        self._deliver: Deliver | None = None
        self.sent = 0  # commands handed to the engine's socket so far (the socket thread's count)
        self._thread: threading.Thread | None = None
        self._up = threading.Event()
        self._failures = 0
        self._restart_at: float | None = None
        self._stopping = False
        self._stop_deadline = 0.0
        self._stop_ok = False
        self._closed = False  # stopped: a later stop answers as the first did, a later abort has nothing to end
        self._engine: Spawned | Attached | None = None
        self._gone: str | None = None  # attached: the address of the engine that went away
        try:
            self._engine = self._spawn()
            self.info: EngineInfo = self._hello(self._engine, start_seconds)
        except BaseException:
            self._close()
            raise

    @property
    def process(self) -> subprocess.Popen | None:
        """The engine process serving now, if this front end started it (None while it restarts)."""
        engine = self._engine
        return engine.process if engine is not None else None

    @property
    def address(self) -> str | None:
        """The address of the engine it talks to now (None while it restarts)."""
        engine = self._engine
        return engine.address if engine is not None else None

    def wait_up(self, timeout: float) -> bool:
        """True once an engine process serves (at once, unless one is restarting)."""
        return self._up.wait(timeout)

    def start(self, deliver: Deliver) -> None:
        self._deliver = deliver
        self._up.set()
        self._thread = threading.Thread(target=self._loop, name="seqserve-engine-socket", daemon=True)
        self._thread.start()

    def add(self, requests: Sequence[EngineRequest]) -> None:
        """Sends the requests and returns: a full queue refuses them a moment later, each with an Output whose
        `refused` says so (the edge answers RESOURCE_EXHAUSTED). Waiting for an answer here would hold the caller (the
        event loop) for a round trip to the engine's thread per call."""
        requests = list(requests)
        if not requests:
            return
        if self._closed:  # stopped: nothing will run them
            self._hand(_cancelled([r.id for r in requests]))
            return
        with self._lock:  # held, then queued to send: an abort seen after it is sent after it
            self._held.update(r.id for r in requests)
            self._commands.put((ADD, tuple(r.id for r in requests), wire.dumps(requests)))

    def abort(self, request_id: int, deadline: bool = False) -> None:
        if not self._closed:  # once stopped, every request it held has ended
            self._commands.put((ABORT, request_id, deadline))

    def stop(self, timeout: float = 10.0) -> bool:
        """Drains the engine process (what it holds ends CANCELLED, outputs delivered) and waits for it to exit."""
        if self._closed:
            return self._stop_ok
        if self._thread is None:
            self.start(lambda report: None)
        self._commands.put((STOP, timeout))
        self._thread.join(timeout + 2 * STOP_MARGIN_SECONDS)
        if self._thread.is_alive():
            log.error("the engine socket thread did not end after stop")
            return False
        self._close()
        return self._stop_ok

    # -- the socket thread

    def _spawn(self) -> Spawned | Attached:
        if self._attach is not None:
            address = self._attach()
            if address is None:
                raise RuntimeError(f"no engine to attach to for {self.cfg.bundle}")
            return Attached(self._ctx, address, self._identity)
        address = f"ipc://{self._dir}/engine-{next(self._starts)}.sock"  # a fresh one: nothing stale reaches it
        return Spawned(self._ctx, self.cfg, address, self._identity, self.cpus, self.limits)

    def _hello(self, engine: Spawned | Attached, seconds: float) -> EngineInfo:
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
                raise RuntimeError(f"{engine.name} for {self.cfg.bundle} went away (exit status "
                                   f"{engine.close(kill=False)}) before it was ready (its log is above)")
        engine.close(kill=True)
        raise RuntimeError(f"the engine process for {self.cfg.bundle} was not ready within {seconds:.0f} s")

    def _loop(self) -> None:
        while True:
            engine = self._engine
            poller = zmq.Poller()
            poller.register(self._commands.fd, zmq.POLLIN)
            if engine is not None:
                poller.register(engine.sock, zmq.POLLIN)
                poller.register(engine.watch, zmq.POLLIN)
            wake = [t for t in (self._restart_at, self._stopping and self._stop_deadline) if t]
            timeout = max(0.0, min(wake) - time.monotonic()) * 1000 if wake else None
            events = dict(poller.poll(timeout))
            if self._commands.fd in events:
                for command in self._commands.take():
                    stopped = self._command(command)
                    self.sent += 1
                    if stopped:
                        return
            if engine is not None and engine.sock in events and self._receive(engine):
                return
            if engine is not None and engine.watch in events and self._died(engine):
                return
            now = time.monotonic()
            if self._stopping and now >= self._stop_deadline:
                log.error("the engine process did not drain in time: killing it")
                self._end_all()
                if self._engine is not None:
                    self._engine.close(kill=True)
                    self._engine = None
                return
            if self._restart_at is not None and now >= self._restart_at:
                self._restart_at = None
                self._again()

    def _command(self, command: tuple) -> bool:
        """True once stopped."""
        kind, engine = command[0], self._engine
        up = engine is not None and engine.up and not self._stopping
        if kind == ADD:
            _, ids, payload = command
            if up:
                engine.sock.send_multipart([ADD, payload])
            else:  # the engine is restarting or stopping: these end at once, as the held ones did
                with self._lock:
                    ids = [i for i in ids if i in self._held]
                if ids:
                    self._end(ids)
        elif kind == ABORT:
            _, request_id, deadline = command
            if up and request_id in self._held:
                engine.sock.send_multipart([ABORT, wire.dumps([request_id, deadline])])
        elif kind == STOP:
            self._stopping = True
            if up and self._attach is None:
                self._stop_deadline = time.monotonic() + command[1] + STOP_MARGIN_SECONDS
                engine.sock.send_multipart([STOP, wire.dumps([float(command[1]), engine.secret])])
                return False
            if up:  # attached: not ours to stop, this front end leaves it
                engine.sock.send_multipart([BYE, wire.dumps(None)])
            return self._left()
        return False

    def _receive(self, engine: Spawned | Attached) -> bool:
        """Every message waiting; True once the engine stopped."""
        while True:
            try:
                kind, payload = engine.sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return False
            if kind == REPORT:
                report = wire.loads(StepReport, payload)
                with self._lock:
                    for out in report.outputs:
                        if out.result is not None or out.refused is not None:
                            self._held.discard(out.request_id)
                self._hand(report)
            elif kind == HELLO:
                engine.up = True
                self._up.set()
                log.info("%s serves again", engine.name)
                if self.on_up is not None and self._attach is None:
                    self.on_up(engine.address)
            elif kind == STOPPED:
                self._stop_ok = wire.loads(bool, payload)
                try:
                    engine.process.wait(STOP_MARGIN_SECONDS)
                except subprocess.TimeoutExpired:
                    log.error("the engine process drained but did not exit: killing it")
                code = engine.close(kill=True)
                self._engine = None
                log.info("engine process %d stopped (exit status %s)", engine.process.pid, code)
                return True

    def _died(self, engine: Spawned | Attached) -> bool:
        """The engine process is gone: what it held ends CANCELLED and a restart is scheduled. True if stopping."""
        code = engine.close(kill=True)
        self._engine = None
        self._up.clear()
        n = self._end_all()
        if self._attach is not None:
            self._gone = engine.address
            self._restart_at = time.monotonic() + ATTACH_RETRY_SECONDS
            log.error("%s went away: its %d requests here end CANCELLED; attaching to its successor", engine.name, n)
            return self._stopping
        if self._stopping:
            log.error("engine process %d %s while draining", engine.process.pid, exit_cause(code))
            self._stop_ok = True
            return True
        if engine.up and time.monotonic() - engine.started >= STABLE_SECONDS:
            self._failures = 0
        delay = restart_delay(self._failures)
        self._failures += 1
        self._restart_at = time.monotonic() + delay
        log.error("engine process %d %s: its %d requests end CANCELLED; restarting it in %.0f s",
                  engine.process.pid, exit_cause(code), n, delay)
        return False

    def _again(self) -> None:
        """Starts the engine process again, or attaches to the one that replaced the engine that went away."""
        if self._attach is not None and self._attach() in (None, self._gone):  # no new one started yet
            self._restart_at = time.monotonic() + ATTACH_RETRY_SECONDS
            return
        log.info("starting the engine process again" if self._attach is None else "attaching to the new engine")
        self._engine = self._spawn()

    def _left(self) -> bool:
        """Stopped without a drain (an attached front end leaves, or no engine was up): what it held ends here."""
        self._end_all()
        if self._engine is not None:
            self._engine.close(kill=True)
            self._engine = None
        self._stop_ok = True
        return True

    def _end_all(self) -> int:
        """Ends every held request."""
        with self._lock:
            ids = sorted(self._held)
            self._held.clear()
        if ids:
            self._hand(_cancelled(ids))
        return len(ids)

    def _end(self, ids: Sequence[int]) -> None:
        with self._lock:
            self._held.difference_update(ids)
        self._hand(_cancelled(ids))

    def _hand(self, report: StepReport) -> None:
        try:
            if self._deliver is not None:
                self._deliver(report)
        except Exception:  # the edge's callback failing must not end supervision
            log.exception("delivering a step report failed")

    def _close(self) -> None:
        self._closed = True
        if self._engine is not None:
            self._engine.close(kill=True)
            self._engine = None
        self._commands.close()
        self._ctx.term()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
