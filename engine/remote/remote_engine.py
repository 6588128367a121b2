"""An engine in its own process, driven through the same interface as one in this process (engine/api.py).

RemoteEngine starts `python -m seqserve.engine.remote.engine_process` (its protocol is described there), takes `.info`
from
its hello, and hands each StepReport to deliver, in order, from its own socket thread. add() sends and returns: a
full queue refuses the requests with Outputs that say so (engine/api.py Output.refused); the front end itself holds
no more than the engine can (engine/remote/engine_held.py), so the queue limit holds whatever the engine does.

Supervision: a socket pair joins this process and the engine's; its end-of-file tells at once that the engine died.
An engine that answers nothing is not ready past --engine-not-ready-seconds and killed past --engine-restart-seconds
(engine/remote/engine_watch.py). Either way every request it held ends UNAVAILABLE saying why, requests added while it
is
down end the same way at once, on_state tells the edge (health, model_ready, restarts by cause), and the engine is
started again with the same EngineConfig after a delay that doubles with each start that does not last. An attached
RemoteEngine (--front-ends) starts nothing: its socket's disconnect event says the engine went away, and it attaches
to the engine the first front end started in its place (engine/remote/engine_link.py).
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

from seqserve.engine.api import Deliver, EngineInfo, EngineRequest, StepReport
from seqserve.engine.build import EngineConfig
from seqserve.engine.limits import Limits
from seqserve.engine.remote import engine_watch as watch
from seqserve.engine.remote import owned_dirs, wire
from seqserve.engine.remote.engine_held import Held, cancelled
from seqserve.engine.remote.engine_link import Attached, Spawned, exit_cause, hello
from seqserve.engine.remote.engine_process import SOCKET_DIR_PREFIX, STOP_MARGIN_SECONDS
from seqserve.engine.remote.engine_watch import STABLE_SECONDS, Silence, Watch
from seqserve.engine.remote.mailbox import Mailbox
from seqserve.engine.remote.wire import ABORT, ADD, BYE, HELLO, PING, REPORT, STOP, STOPPED

log = logging.getLogger("seqserve.engine.remote.remote_engine")

START_SECONDS = 600.0  # an engine process loads and warms up its model within this
ATTACH_RETRY_SECONDS = 0.2  # an attached front end looks this often for the engine that replaced a dead one
OnState = Callable[[bool, "str | None"], None]  # (ready, why a restart began: its cause, for the metric)


class RemoteEngine:
    """api.EngineClient for an engine process this front end starts and supervises, or (attach) one that another
    front end started (server/front_ends.py)."""

    def __init__(self, cfg: EngineConfig, start_seconds: float = START_SECONDS, cpus: str = "",
                 attach: Callable[[], str | None] | None = None, name: str = "",
                 silence: Silence = Silence(), limits: Limits | None = None) -> None:
        """attach: instead of starting an engine process, connect to the one another front end started; it gives that
        engine's address now (None while it has none), and is asked again when the engine went away. name: the
        model's, for what its calls hear; silence: the bounds on an engine that answers nothing; limits: those its
        requests keep (the engine checks each again; needed unless attaching)."""
        if attach is None and limits is None:
            raise ValueError("an engine process this front end starts needs its model's request limits")
        self.cfg, self.cpus, self._attach, self.name, self.start_seconds = cfg, cpus, attach, name, start_seconds
        self.limits = limits
        self.on_up: Callable[[str], None] | None = None  # an engine this one started (again) serves at this address
        self.on_state: OnState | None = None  # from the socket thread: ready or not, and a restart's cause
        self.ready = True  # the engine answers (False while it is silent past the bound, or down)
        self._watch = Watch(silence)
        self._cause: str | None = None  # why the engine is down (for the calls that arrive meanwhile)
        self.held = Held(cfg.scheduler.max_batch_size + cfg.scheduler.max_waiting, self._hand)
        self._dir = str(owned_dirs.make(SOCKET_DIR_PREFIX)) if attach is None else None  # 0700: this user only
        self._ctx = zmq.Context()
        self._identity = f"front-{os.getpid()}-{uuid.uuid4().hex}".encode()
        self._starts = itertools.count(1)
        self._commands = Mailbox()  # the caller's add, abort and stop, to the socket thread
        self._deliver: Deliver | None = None
        self.sent = 0  # test hook: commands handed to the engine's socket so far (tests wait on it, not on time)
        self._thread: threading.Thread | None = None
        self._up = threading.Event()
        self._restart_at: float | None = None
        self._stopping = False
        self._stop_deadline = 0.0
        self._stop_ok = False
        self._closed = False  # stopped: a later stop answers as the first did, a later abort has nothing to end
        self._engine: Spawned | Attached | None = None
        self._gone: str | None = None  # attached: the address of the engine that went away
        try:
            self._engine = self._spawn()
            self.info: EngineInfo = hello(self._engine, start_seconds, cfg.bundle)
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
        """Test hook: True once an engine process serves (at once, unless one is restarting)."""
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
            self._hand(cancelled([r.id for r in requests]))
            return
        with self.held.lock:  # held, then queued to send: an abort seen after it is sent after it
            self.held.take([r.id for r in requests])  # QueueFull past what the engine itself can hold
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
        return Spawned(self._ctx, self.cfg, address, self._identity, self.limits, self.cpus)

    def _loop(self) -> None:
        while True:
            engine = self._engine
            poller = zmq.Poller()
            poller.register(self._commands.fd, zmq.POLLIN)
            if engine is not None:
                poller.register(engine.sock, zmq.POLLIN)
                poller.register(engine.watch, zmq.POLLIN)
            wake = [t for t in (self._restart_at, self._stopping and self._stop_deadline, self._due(engine)) if t]
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
                self.held.end_all()
                if self._engine is not None:
                    self._engine.close(kill=True)
                    self._engine = None
                return
            if self._restart_at is not None and now >= self._restart_at:
                self._restart_at = None
                self._again()
            elif self._engine is not None and self._check(self._engine, now):
                return

    def _due(self, engine: Spawned | Attached | None) -> float | None:
        """When _check has something to do: a ping, a bound on silence, or the start's bound."""
        if engine is None:
            return None
        return self._watch.wake(time.monotonic()) if engine.up else engine.started + self.start_seconds

    def _check(self, engine: Spawned | Attached, now: float) -> bool:
        """Pings a quiet engine and applies the bounds on its silence (engine_watch.py); True once stopped."""
        if not engine.up:  # started again and not ready yet: loading has its own bound
            if now - engine.started < self.start_seconds or self._attach is not None:
                return False
            log.error("%s was not ready within %.0f s: killing it", engine.name, self.start_seconds)
            return self._died(engine, watch.HUNG)
        if self._watch.ping_due(now):
            engine.sock.send_multipart([PING, wire.dumps(None)])
        silent, bounds = self._watch.silent(now), self._watch.silence
        if silent >= bounds.abandon:
            self.held.abandon()
            if self._stopping:  # every call has ended: nothing it could still send matters
                log.error("%s answers nothing while it stops: killing it", engine.name)
                self._stop_deadline = now
        if silent >= bounds.not_ready and self.ready:
            log.error("%s has answered nothing for %.1f s: model %s not ready", engine.name, silent, self.name)
            self._state(False)
        if silent >= bounds.restart and self._attach is None and not self._stopping:
            log.error("%s has answered nothing for %.1f s: killing it", engine.name, silent)
            return self._died(engine, watch.HUNG)
        return False

    def _command(self, command: tuple) -> bool:
        """True once stopped."""
        kind, engine = command[0], self._engine
        up = engine is not None and engine.up and not self._stopping
        if kind == ADD:
            _, ids, payload = command
            if up and self.ready:
                engine.sock.send_multipart([ADD, payload])
            else:  # the engine is restarting, silent or stopping: these end at once, as the held ones did
                if ids := self.held.only_held(ids):
                    up = engine is not None and engine.up
                    self.held.end(ids, None if self._stopping else self._watch.refusal(self.name, up, self._cause))
        elif kind == ABORT:
            _, request_id, deadline = command
            if up and self.held.holds(request_id):
                engine.sock.send_multipart([ABORT, wire.dumps([request_id, deadline])])
                self.held.aborted[request_id] = deadline
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
            self._watch.hear(time.monotonic())
            if kind == HELLO:
                engine.up = True
                self._up.set()
                log.info("%s serves again", engine.name)
                if self.on_up is not None and self._attach is None:
                    self.on_up(engine.address)
            if engine.up and not self.ready and kind != STOPPED:
                log.info("%s answers: model %s ready", engine.name, self.name)
                self._state(True)
            if kind == REPORT:
                self._hand(self.held.ended(wire.loads(StepReport, payload)))
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

    def _died(self, engine: Spawned | Attached, cause: str | None = None) -> bool:
        """The engine process is gone (cause HUNG: killed here for its silence): what it held ends UNAVAILABLE saying
        why, its model is not ready, and a restart is scheduled. True if stopping."""
        code = engine.close(kill=True)  # one exiting of itself is given the time to say how it ended
        self._engine = None
        self._up.clear()
        if self._attach is None and cause is None:
            cause = watch.EXITED if code >= 0 else watch.KILLED
        self._cause = cause
        n = self.held.end_all(None if self._stopping else watch.ended_message(self.name, cause))
        if self._attach is not None:
            self._gone = engine.address
            self._restart_at = time.monotonic() + ATTACH_RETRY_SECONDS
            log.error("%s went away: its %d requests here end UNAVAILABLE; attaching to its successor", engine.name,
                      n)
            self._state(False)
            return self._stopping
        if self._stopping:
            log.error("engine process %d %s while draining", engine.process.pid, exit_cause(code))
            self._stop_ok = True
            return True
        delay = self._watch.restart_delay(engine.up and time.monotonic() - engine.started >= STABLE_SECONDS)
        self._restart_at = time.monotonic() + delay
        how = watch.WHAT[cause] if cause == watch.HUNG else exit_cause(code)
        log.error("engine process %d %s: its %d requests end UNAVAILABLE; restarting it in %.0f s",
                  engine.process.pid, how, n, delay)
        self._state(False, cause)
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
        self.held.end_all()
        if self._engine is not None:
            self._engine.close(kill=True)
            self._engine = None
        self._stop_ok = True
        return True

    def _state(self, ready: bool, cause: str | None = None) -> None:
        """Tells the edge (on_state): ready or not, and the cause when a restart of its own engine begins."""
        self.ready = ready
        if self.on_state is not None:  # it only hands the news to the event loop
            self.on_state(ready, cause)

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
