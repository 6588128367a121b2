"""The engine in a process of its own: `python -m seqserve.engine.remote.engine_process --address ipc://... --lifeline
FD`,
its EngineConfig (engine/remote/wire.py) on stdin. engine/remote/remote_engine.py starts it and is its front end.

One ROUTER socket; each front end (one per gRPC front-end process) connects a DEALER under its own identity, so
several front ends can share the engine. Messages are multipart [kind, msgpack payload]:

    front end -> engine                         engine -> front end
    HELLO  -                                    HELLO   EngineInfo
    ADD    [EngineRequest, ...]                 REPORT  StepReport with this front end's outputs (a refused add:
    ABORT  [id, deadline]                               an Output per request, `refused` set: all or none)
    STOP   timeout (the owner)                  STOPPED bool (after the last REPORT; then the process exits 0)
    BYE    - (a front end that leaves)
    PING   - (nothing heard for a while)        BEAT    - (read between two steps: engine/remote/engine_watch.py)

Ids: each front end numbers its requests as it likes; the engine gives each its own id and maps the outputs back,
so two front ends may both use id 1. Figures: each step's StepStats go to one front end only (the first still
connected): they describe the engine, not a caller, and Prometheus sums the front ends' counters, so a step sent to
every front end would be counted once per front end. The lifeline is a socket whose other end the starting front end
holds: it reads end-of-file when that process dies, and the engine then drains and exits rather than live on alone.
Its parent alone stops it: it runs in a process group of its own (Ctrl-C's SIGINT never reaches it) and ignores
SIGINT and SIGTERM (systemd's KillMode=control-group signals every process of the service), so a signal meant for the
server drains the server, which then stops its engines.

Trust: the socket's directory is private (0700), but anything of this user may reach it, so every message is checked.
A malformed one (a wrong number of frames, an unknown kind, bytes that are not msgpack, wrong types or shapes) is
logged and dropped; an ADD whose requests break a bound (engine/remote/request_bounds.py: the edge's own ranges) is
answered
with an ERROR result for each; only a STOP that carries the secret the starting front end handed over on stdin
(Launch: never argv, which every user can read) stops the engine. The engine lives on through all of them.
"""
from __future__ import annotations

import argparse
import dataclasses
import hmac
import itertools
import logging
import math
import os
import shutil
import signal
import socket
import sys
from collections import defaultdict
from pathlib import Path

import zmq

from seqserve.engine.api import EngineRequest, Output, QueueFull, StepReport, StepStats
from seqserve.engine.build import EngineConfig, build
from seqserve.engine.limits import Limits
from seqserve.engine.remote import wire
from seqserve.engine.remote.cpus import cpu_list
from seqserve.engine.remote.request_bounds import request_problem
from seqserve.engine.remote.wire import ABORT, ADD, BEAT, BYE, HELLO, PING, REPORT, STOP, STOPPED
from seqserve.engine.request import FinishReason, Result
from seqserve.engine.step.core import EngineCore

log = logging.getLogger("seqserve.engine.remote.engine_process")

LINGER_MS = 5_000  # how long the exiting engine keeps trying to hand its last reports to a front end
STOP_MARGIN_SECONDS = 5.0  # beyond stop's own timeout, for the last reports and the process exit
SOCKET_DIR_PREFIX = "seqserve-engine-"  # the private directory a front end makes for its engines' ipc sockets
LOGGED_DROPS = 100  # malformed messages logged one by one; beyond, every hundredth (a flood must not flood the log)


@dataclasses.dataclass(frozen=True)
class Launch:
    """What the starting front end hands its engine process on stdin: the engine's config, the request limits every
    ADD is checked against (the server's, resolved for the model), and the secret a STOP carries."""

    cfg: EngineConfig
    limits: Limits
    secret: bytes


class EngineServer:
    """The socket thread of an engine process: requests in from front ends, the engine's reports out to them."""

    def __init__(self, core: EngineCore, address: str, lifeline: socket.socket | None, limits: Limits,
                 secret: bytes) -> None:
        self.core, self.lifeline, self.limits, self.secret = core, lifeline, limits, secret
        self.vocab_size = int(core.info.model_info["config"]["vocab_size"])
        self.dropped = 0  # malformed messages so far
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.ROUTER_MANDATORY, 1)  # a send to a front end that left raises instead of vanishing
        self.sock.setsockopt(zmq.SNDHWM, 0)  # nothing accepted is dropped for a slow front end
        self.sock.setsockopt(zmq.RCVHWM, 0)
        self.sock.bind(address)
        self.fronts: list[bytes] = []  # front ends in the order they said hello; the first gets the figures
        self.owner: dict[int, tuple[bytes, int]] = {}  # engine id -> (front end, its id)
        self.engine_id: dict[tuple[bytes, int], int] = {}
        self.orphaned = False  # the starting front end died: nobody else will remove its socket directory
        self._ids = itertools.count(1)

    def serve(self) -> int:
        """Until a STOP (or the starting front end's death); the process's exit status. One thread reads the socket,
        steps the engine and sends its reports: no other thread competes with the engine for the GIL."""
        self.core.attach(self._send_report)
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLIN)
        if self.lifeline is not None:
            poller.register(self.lifeline.fileno(), zmq.POLLIN)
        try:
            while True:
                events = dict(poller.poll(0 if self.core.has_work() else None))  # busy: look, never wait
                if self.sock in events and (stopped := self._receive()) is not None:
                    front, timeout = stopped
                    ok = self.core.stop(timeout)  # drains here: its reports go out before STOPPED
                    self._send(front, STOPPED, ok)
                    return 0
                if self.lifeline is not None and self.lifeline.fileno() in events:
                    log.warning("the front end that started this engine is gone: draining and exiting")
                    self.orphaned = True
                    self.core.stop()
                    return 0
                if self.core.has_work():
                    self.core.step()
        finally:
            self.sock.close(linger=LINGER_MS)
            self.ctx.term()

    def _receive(self) -> tuple[bytes, float] | None:
        """Every message waiting; (front end, timeout) once its owner asked it to stop. A malformed one is dropped."""
        while True:
            try:
                parts = self.sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return None
            if len(parts) != 3:  # the ROUTER's identity frame, then the sender's kind and payload
                self._drop(parts[1] if len(parts) > 1 else b"", f"{len(parts) - 1} frames, expected 2")
                continue
            front, kind, payload = parts
            try:
                if (timeout := self._handle(front, kind, payload)) is not None:
                    return front, timeout
            except wire.WireError as e:
                self._drop(kind, str(e))

    def _handle(self, front: bytes, kind: bytes, payload: bytes) -> float | None:
        """One message; a STOP's timeout. WireError: a malformed one."""
        if kind == HELLO:
            if front not in self.fronts:
                self.fronts.append(front)
            self._send(front, HELLO, self.core.info)
        elif kind == ADD:
            self._add_checked(front, wire.loads(list[EngineRequest], payload))
        elif kind == ABORT:
            request_id, deadline = wire.loads(tuple[int, bool], payload)
            if (eid := self.engine_id.get((front, request_id))) is not None:
                self.core.abort(eid, deadline)
        elif kind == STOP:
            return self._stop_timeout(payload)
        elif kind == BYE:
            self._leave(front)
        elif kind == PING:
            self._send(front, BEAT, None)
        else:
            raise wire.WireError("unknown kind")
        return None

    def _stop_timeout(self, payload: bytes) -> float:
        timeout, secret = wire.loads(tuple[float, bytes], payload)
        if not hmac.compare_digest(secret, self.secret):  # in constant time: nothing learnt from how long it took
            raise wire.WireError("a STOP without this engine's secret (only the front end that started it stops it)")
        if not (math.isfinite(timeout) and timeout >= 0):
            raise wire.WireError(f"a STOP's timeout must be finite and >= 0, got {timeout}")
        return timeout

    def _drop(self, kind: bytes, why: str) -> None:
        self.dropped += 1
        if self.dropped <= LOGGED_DROPS or self.dropped % LOGGED_DROPS == 0:
            log.warning("dropped a malformed message (kind %r; %d so far): %s", kind[:16], self.dropped, why)

    def _add_checked(self, front: bytes, requests: list[EngineRequest]) -> None:
        """Adds the requests (all or none), or answers each: an ERROR when one breaks a bound, refused when full."""
        if (problem := self._problem(front, requests)) is not None:
            log.warning("refused an add of %d requests: %s", len(requests), problem)
            result = Result(FinishReason.ERROR, error=f"the engine refused the request: {problem}")
            self._send(front, REPORT, StepReport(tuple(Output(r.id, result=result) for r in requests), StepStats()))
        elif (refusal := self._add(front, requests)) is not None:  # all or none: every one is told
            outputs = tuple(Output(r.id, refused=refusal) for r in requests)
            self._send(front, REPORT, StepReport(outputs, StepStats()))

    def _problem(self, front: bytes, requests: list[EngineRequest]) -> str | None:
        ids = [r.id for r in requests]
        if len(set(ids)) != len(ids) or any((front, i) in self.engine_id for i in ids):
            return "a request id that this front end already uses"
        for r in requests:
            if (problem := request_problem(r, self.limits, self.vocab_size)) is not None:
                return f"request {r.id}: {problem}"
        return None

    def _add(self, front: bytes, requests: list[EngineRequest]) -> str | None:
        """Adds every request or none; QueueFull's message when none."""
        ids = [next(self._ids) for _ in requests]
        try:
            self.core.add([dataclasses.replace(r, id=eid) for r, eid in zip(requests, ids)])
        except QueueFull as e:
            return str(e) or "queue full"
        for r, eid in zip(requests, ids):  # before this thread takes the reports that may name them
            self.owner[eid] = (front, r.id)
            self.engine_id[(front, r.id)] = eid
        return None

    def _send_report(self, report: StepReport) -> None:
        """A step's report, split by front end: each gets its requests' outputs (under its own ids), the first the
        figures."""
        by_front: dict[bytes, list] = defaultdict(list)
        for out in report.outputs:
            front, request_id = self.owner.get(out.request_id, (None, None))
            if front is None:
                continue
            if out.result is not None:
                del self.owner[out.request_id], self.engine_id[(front, request_id)]
            by_front[front].append(dataclasses.replace(out, request_id=request_id))
        stats_to = self.fronts[0] if self.fronts else None
        for front in list(self.fronts):
            if by_front.get(front) or front == stats_to:
                stats = report.stats if front == stats_to else StepStats()
                self._send(front, REPORT, StepReport(tuple(by_front.get(front, ())), stats))

    def _send(self, front: bytes, kind: bytes, value) -> None:
        try:
            self.sock.send_multipart([front, kind, wire.dumps(value)])
        except zmq.ZMQError as e:
            if e.errno != zmq.EHOSTUNREACH:
                raise
            log.warning("a front end left without saying so: its requests are cancelled")
            self._leave(front)

    def _leave(self, front: bytes) -> None:
        """A front end is gone: its requests are cancelled, and their outputs go nowhere."""
        if front in self.fronts:
            self.fronts.remove(front)
        for (f, _), eid in list(self.engine_id.items()):
            if f == front:
                self.core.abort(eid)


def main(argv: list[str] | None = None) -> int:
    for sig in (signal.SIGINT, signal.SIGTERM):  # the parent stops this process (STOP, the lifeline), not a signal
        signal.signal(sig, signal.SIG_IGN)
    parser = argparse.ArgumentParser(prog="python -m seqserve.engine.remote.engine_process",
                                     description="an engine process (started by a front end: "
                                                 "engine/remote/remote_engine.py)")
    parser.add_argument("--address", required=True, help="the ZeroMQ address to bind (ipc://...)")
    parser.add_argument("--lifeline", type=int, help="a socket fd: its end-of-file means the front end is gone")
    parser.add_argument("--log-level", default="INFO")
    parser.add_argument("--cpus", default="", help="the CPUs this process runs on (taskset -c syntax; empty: its "
                                                   "parent's)")
    args = parser.parse_args(argv)
    if args.cpus:  # before onnxruntime sizes its thread pool
        os.sched_setaffinity(0, cpu_list(args.cpus))
    logging.basicConfig(level=args.log_level, stream=sys.stderr,
                        format="%(asctime)s engine[%(process)d] %(levelname)s %(name)s: %(message)s")
    lifeline = socket.socket(fileno=args.lifeline) if args.lifeline is not None else None
    try:
        launch = wire.loads(Launch, sys.stdin.buffer.read())
        core = build(launch.cfg)
        log.info("engine of %s (%s, %s) serving on %s", launch.cfg.bundle, core.info.variant, core.info.provider,
                 args.address)
        server = EngineServer(core, args.address, lifeline, launch.limits, launch.secret)
        code = server.serve()
    except Exception as e:  # logged here, so the front end's "exited with status 1" has its cause beside it
        log.critical("the engine failed and exits: %s: %s", type(e).__name__, e, exc_info=True)
        return 1
    folder = Path(args.address.removeprefix("ipc://")).parent
    if server.orphaned and args.address.startswith("ipc://") and folder.name.startswith(SOCKET_DIR_PREFIX):
        shutil.rmtree(folder, ignore_errors=True)  # the sockets of this engine and of any killed before it
    return code


if __name__ == "__main__":
    sys.exit(main())
