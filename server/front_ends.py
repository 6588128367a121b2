"""Several gRPC front ends on one port (`--front-ends N`, with `--engine-process`): one engine process per model,
shared by N front-end processes, each with its own event loop and core.

The server the user starts is the first front end: it loads the models, starts and supervises their engine
processes, and writes where each engine listens into `engines.json` in a private directory. It then starts N-1 more
`seqserve serve` processes with the same flags and `_SEQSERVE_FRONT_END=INDEX:PORT:PATH` in their environment: each
binds the port the first listens on (SO_REUSEPORT: the kernel spreads new connections over them; server/port_claim.py
keeps other servers out), attaches to the engines `engines.json` names (RemoteEngine(attach=...)) and serves its own
/metrics on --metrics-port + INDEX. The first front end
rewrites the file when an engine process is started again (after a crash: an attached front end's calls on the dead
one end UNAVAILABLE and it attaches to the new one) and after a reload (SIGHUP), which it then passes on to the
others. A drain (SIGTERM) drains the other front ends first, then the engines stop. A front end that exits on its
own is started again after the engines' back-off (remote_engine.RESTART_DELAYS); one whose first front end is gone
removes engines.json's directory, drains and exits.

An attached front end that cannot attach (engines.json unreadable or corrupt, no engine listed for its model's
version, the engine's socket file gone as /tmp cleaners remove files, no answer within ATTACH_SECONDS) logs one line
saying so and exits 2; the first front end starts it again after the back-off.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from seqserve.engine.build import EngineConfig
from seqserve.engine.remote import owned_dirs
from seqserve.engine.remote.engine_link import exit_cause
from seqserve.engine.remote.engine_watch import STABLE_SECONDS, Silence, restart_delay
from seqserve.engine.remote.remote_engine import RemoteEngine
from seqserve.server.settings import SettingsError

log = logging.getLogger("seqserve.server.front_ends")
ROLE = "_SEQSERVE_FRONT_END"  # INDEX:PORT:PATH in an attached front end's environment (the server sets it)
ENGINES = "engines.json"
DIR_PREFIX = "seqserve-front-ends-"  # engines.json's private directory
WATCH_SECONDS = 0.5  # how often the first front end looks at the others, and the others at the first
ATTACH_SECONDS = 10.0  # an engine engines.json lists is up: it answers an attaching front end's hello within this


class AttachError(SettingsError):
    """An attached front end cannot reach an engine: one line, exit 2, and the first front end starts it again."""


@dataclass(frozen=True)
class Role:
    """An attached front end's place: its index (1..N-1), the port the first listens on, the first's engines.json."""

    index: int
    port: int
    engines: Path

    @classmethod
    def from_environ(cls) -> Role | None:
        index, port, path = (os.environ.get(ROLE, "").split(":", 2) + ["", ""])[:3]
        return cls(int(index), int(port), Path(path)) if index.isdigit() and port.isdigit() and path else None

    def entries(self) -> dict:
        """engines.json: model name -> its engine's address and its version's digest. AttachError: unreadable, or
        corrupt (the first front end writes it anew when an engine is started again, and on SIGHUP)."""
        try:
            entries = json.loads(self.engines.read_text())
        except OSError as exc:
            raise AttachError(f"cannot read {self.engines}: {exc.strerror}") from None
        except ValueError as exc:
            raise AttachError(f"{self.engines} is corrupt (not JSON: {exc})") from None
        if not isinstance(entries, dict) or not all(
                isinstance(e, dict) and isinstance(e.get("address"), str) and isinstance(e.get("digest"), str)
                for e in entries.values()):
            raise AttachError(f"{self.engines} is corrupt (not a map of model to address and digest)")
        return entries

    def lookup(self, name: str, digest: str) -> str:
        """Where the engine of this model version listens now. AttachError: nowhere, or engines.json is corrupt."""
        entry = self.entries().get(name)
        if entry is None or entry["digest"] != digest:
            raise AttachError(f"{self.engines} lists no engine for this version of model {name}")
        return entry["address"]

    def address(self, name: str, digest: str) -> str | None:
        """lookup, for a front end that attaches again (never raises): None while there is none."""
        try:
            return self.lookup(name, digest)
        except AttachError:
            return None


def attach_engine(cfg: EngineConfig, role: Role, name: str, digest: str, silence: Silence) -> RemoteEngine:
    """An attached front end's engine for one model: the one engines.json lists, reached within ATTACH_SECONDS."""
    address = role.lookup(name, digest)
    path = address.removeprefix("ipc://")
    if address.startswith("ipc://") and not os.path.exists(path):  # ZeroMQ would wait for it silently
        raise AttachError(f"model {name}: its engine's socket {path} is gone (removed by a cleaner of temporary "
                          "files?): this front end cannot reach that engine")
    log.info("model %s: attaching to its engine at %s (for up to %.0f s)", name, address, ATTACH_SECONDS)
    try:
        return RemoteEngine(cfg, ATTACH_SECONDS, attach=lambda: role.address(name, digest), name=name, silence=silence)
    except RuntimeError as exc:
        raise AttachError(f"model {name}: {exc}") from None


def metrics_port(port: int, index: int) -> int:
    """An attached front end's /metrics port: the first's + its index (0 picks one, -1 disables, as for the first)."""
    return port + index if port > 0 else port


class FrontEnds:
    """In the first front end: the others, their engines.json, their supervision."""

    def __init__(self, n: int, models, port: int) -> None:
        """models: the app's loaded models by name (each with .engine and .source); port: the one it listens on."""
        self.n, self.models, self.port = n, models, port
        self.dir = owned_dirs.make(DIR_PREFIX)  # 0700: only this user reads it
        self.procs: dict[int, subprocess.Popen] = {}
        self._started: dict[int, float] = {}  # when each was last started
        self._failures: dict[int, int] = {}  # its starts in a row that did not last (the back-off's count)
        self._restart_at: dict[int, float] = {}  # the dead ones: when each is started again
        self._stopping = False
        self._watch: asyncio.Task | None = None

    def write(self) -> None:
        """engines.json from the models loaded now (atomically: a reader sees the old file or the new one)."""
        entries = {name: {"address": m.engine.address, "digest": m.source.digest} for name, m in self.models.items()
                   if getattr(m.engine, "address", None)}
        tmp = self.dir / f".{ENGINES}.tmp"
        tmp.write_text(json.dumps(entries))
        os.replace(tmp, self.dir / ENGINES)

    def start(self) -> None:
        self.write()
        for i in range(1, self.n):
            self._spawn(i)
        self._watch = asyncio.ensure_future(self._supervise())

    def _spawn(self, index: int) -> None:
        argv = [sys.executable, "-m", "seqserve.cli.main", *sys.argv[1:]]  # the same `serve` and flags
        env = os.environ | {ROLE: f"{index}:{self.port}:{self.dir / ENGINES}"}
        self.procs[index] = subprocess.Popen(argv, env=env)
        self._started[index] = time.monotonic()
        log.info("front end %d started (pid %d)", index, self.procs[index].pid)

    async def _supervise(self) -> None:
        while not self._stopping:
            await asyncio.sleep(WATCH_SECONDS)
            for index, proc in list(self.procs.items()):
                if proc.poll() is None or self._stopping:
                    continue
                if index not in self._restart_at:  # just found dead: the back-off, as for an engine process
                    if time.monotonic() - self._started[index] >= STABLE_SECONDS:
                        self._failures[index] = 0
                    delay = restart_delay(self._failures.get(index, 0))
                    self._failures[index] = self._failures.get(index, 0) + 1
                    self._restart_at[index] = time.monotonic() + delay
                    log.error("front end %d (pid %d) %s: starting it again in %.0f s", index, proc.pid,
                              exit_cause(proc.returncode), delay)
                if time.monotonic() >= self._restart_at[index]:
                    del self._restart_at[index]
                    self._spawn(index)

    def reloaded(self) -> None:
        """After the first front end's reload: the file says where the new versions listen, then the others reload."""
        self.write()
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGHUP)

    async def stop(self, timeout: float) -> None:
        """Drains the other front ends (SIGTERM) and waits for them to exit; killed after timeout seconds."""
        self._stopping = True
        if self._watch is not None:
            self._watch.cancel()
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        end = time.monotonic() + timeout
        for index, proc in self.procs.items():
            try:
                await asyncio.to_thread(proc.wait, max(0.0, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.error("front end %d did not drain within %.0f s: killing it", index, timeout)
                proc.kill()
                await asyncio.to_thread(proc.wait)
        shutil.rmtree(self.dir, ignore_errors=True)


async def watch_first(first_pid: int, stop, role: Role) -> None:
    """In an attached front end: stop (drain) once the first front end is gone (this process is then re-parented),
    and remove engines.json's directory, which the first can no longer remove."""
    while os.getppid() == first_pid:
        await asyncio.sleep(WATCH_SECONDS)
    log.error("the first front end (pid %d) is gone: draining", first_pid)
    if role.engines.parent.name.startswith(DIR_PREFIX):
        shutil.rmtree(role.engines.parent, ignore_errors=True)
    stop()
