"""The `seqserve serve` process: signals (server/signals.py) around one App (server/app.py), from start to drain.

SIGTERM/SIGINT drain the app and the process exits 0; SIGHUP re-reads the models. An attached front end
(server/front_ends.py) takes its metrics port from its index and drains when the first front end is gone.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import os

from seqserve.server import sched, signals
from seqserve.server.app import App
from seqserve.server.front_ends import Role, metrics_port, watch_first
from seqserve.server.settings import Settings

log = logging.getLogger("seqserve")


async def _serve(settings: Settings) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    signals.on_stop(loop, stop.set)  # not loop.add_signal_handler: its loop puts back the default action on closing
    if signals.received():  # during start-up, before these handlers (signals.hold): nothing to drain yet
        log.info("stopped before serving: a signal arrived while starting")
        return 0
    role = Role.from_environ()  # an attached front end (server/front_ends.py), or None
    if role is not None:
        settings = dataclasses.replace(settings, metrics_port=metrics_port(settings.metrics_port, role.index),
                                       port=role.port)  # the first's (it may have picked it: --port 0)
    app = App(settings, role=role)
    reloads: set[asyncio.Task] = set()
    watching = loop.create_task(watch_first(os.getppid(), stop.set, role)) if role is not None else None

    def reload() -> None:  # one re-read at a time (App.reload's lock); a SIGHUP during one queues the next
        task = loop.create_task(app.reload())
        reloads.add(task)
        task.add_done_callback(reloads.discard)

    loop.add_signal_handler(signals.RELOAD, reload)
    if signals.reload_asked():
        reload()
    await app.start()
    await stop.wait()
    loop.remove_signal_handler(signals.RELOAD)  # which puts back SIGHUP's default action (ending the process): so
    signals.draining()
    for task in reloads:  # a re-read still loading: the drain stops the server instead
        task.cancel()
    if watching is not None:
        watching.cancel()
    await app.drain()
    log.info("stopped")
    return 0


def run(settings: Settings) -> int:
    """The `seqserve serve` entry point: serves until SIGTERM/SIGINT, then drains and returns 0."""
    logging.basicConfig(level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not settings.engine_process:  # the edge yields to an engine that shares its cores (server/sched.py)
        sched.batch()  # before any other thread starts: every thread but the engine's takes it
    return asyncio.run(_serve(settings))
