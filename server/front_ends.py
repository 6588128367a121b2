"""Several gRPC front ends on one port (`--front-ends N`, with `--engine-process`): one engine process per model,
shared by N front-end processes, each with its own event loop and core.

The server the user starts is the first front end: it loads the models, starts and supervises their engine
processes, and writes where each engine listens into `engines.json` in a private directory. It then starts N-1 more
`seqserve serve` processes with the same flags and `_SEQSERVE_FRONT_END=INDEX:PATH` in their environment: each binds
the same port (SO_REUSEPORT: the kernel spreads new connections over them), attaches to the engines `engines.json`
names (RemoteEngine(attach=...)) and serves its own /metrics on --metrics-port + INDEX. The first front end
rewrites the file when an engine process is started again (after a crash: an attached front end's calls on the dead
one end UNAVAILABLE and it attaches to the new one) and after a reload (SIGHUP), which it then passes on to the
others. A drain (SIGTERM) drains the other front ends first, then the engines stop. A front end that exits on its
own is started again; one whose first front end is gone drains and exits.
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
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("seqserve.server.front_ends")
ROLE = "_SEQSERVE_FRONT_END"  # INDEX:PATH in an attached front end's environment (not a setting: the server sets it)
ENGINES = "engines.json"
RESTART_SECONDS = 1.0  # an attached front end that exited on its own is started again after this
WATCH_SECONDS = 0.5  # how often the first front end looks at the others, and the others at the first


@dataclass(frozen=True)
class Role:
    """An attached front end's place: its index (1..N-1) and the first front end's engines.json."""

    index: int
    engines: Path

    @classmethod
    def from_environ(cls) -> Role | None:
        value = os.environ.get(ROLE, "")
        index, _, path = value.partition(":")
        return cls(int(index), Path(path)) if index.isdigit() and path else None

    def address(self, name: str, digest: str) -> str | None:
        """Where the engine of this model version listens now (None: the first front end has none for it)."""
        try:
            entry = json.loads(self.engines.read_text()).get(name)
        except (OSError, ValueError):
            return None
        return entry["address"] if entry and entry.get("digest") == digest else None


def metrics_port(port: int, index: int) -> int:
    """An attached front end's /metrics port: the first's + its index (0 picks one, -1 disables, as for the first)."""
    return port + index if port > 0 else port


class FrontEnds:
    """In the first front end: the others, their engines.json, their supervision."""

    def __init__(self, n: int, models) -> None:
        """models: the app's loaded models by name (each with .engine and .source)."""
        self.n, self.models = n, models
        self.dir = Path(tempfile.mkdtemp(prefix="seqserve-front-ends-"))  # 0700: only this user reads it
        self.procs: dict[int, subprocess.Popen] = {}
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
        env = os.environ | {ROLE: f"{index}:{self.dir / ENGINES}"}
        self.procs[index] = subprocess.Popen(argv, env=env)
        log.info("front end %d started (pid %d)", index, self.procs[index].pid)

    async def _supervise(self) -> None:
        while not self._stopping:
            await asyncio.sleep(WATCH_SECONDS)
            for index, proc in list(self.procs.items()):
                if proc.poll() is not None and not self._stopping:
                    log.error("front end %d (pid %d) exited with status %s: starting it again", index, proc.pid,
                              proc.returncode)
                    await asyncio.sleep(RESTART_SECONDS)
                    if not self._stopping:
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


async def watch_first(first_pid: int, stop) -> None:
    """In an attached front end: stop (drain) once the first front end is gone (this process is then re-parented)."""
    while os.getppid() == first_pid:
        await asyncio.sleep(WATCH_SECONDS)
    log.error("the first front end (pid %d) is gone: draining", first_pid)
    stop()
