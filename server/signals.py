"""SIGTERM and SIGINT (and SIGHUP, which re-reads the models) from the first moment of `seqserve serve` to its exit.

`seqserve serve` calls `hold` in the first module of ours it runs (cli/__init__.py, and again in `cli.main.main`),
before it imports anything slow (argparse, grpc, onnxruntime, numpy: about half a second, before the event loop
exists); a signal before that, while the interpreter itself starts, ends the process with the default action (exit
143; docs/security.md measures that bound). The handler only remembers the signal; serve._serve then stops at once (exit 0), or drains
if the signal came while it was starting. `on_stop` lets the event loop hear SIGTERM/SIGINT through this same handler
rather than through loop.add_signal_handler, whose loop puts back the default action when it closes, so that no
instant from `hold` to the process's exit ends it with 143 (`done` ignores them once the server has stopped).
"""
from __future__ import annotations

import signal
from collections.abc import Callable

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (6 ms before the handler, measured)
if TYPE_CHECKING:  # asyncio itself is imported later: hold runs before anything that takes time
    import asyncio

SIGNALS = (signal.SIGTERM, signal.SIGINT)
RELOAD = signal.SIGHUP  # re-read the models (its default action would end the process)
_received: set[int] = set()
_stop: tuple[asyncio.AbstractEventLoop, Callable[[], None]] | None = None  # on_stop's loop and callback


def hold() -> None:
    """Remember SIGTERM/SIGINT/SIGHUP (call it before the slow imports); SIGHUP until the event loop's handler."""
    for sig in (*SIGNALS, RELOAD):
        signal.signal(sig, _remember)


def on_stop(loop: asyncio.AbstractEventLoop, callback: Callable[[], None]) -> None:
    """From now on SIGTERM/SIGINT also run callback on loop (thread-safe, as the loop's own handlers do)."""
    global _stop
    _stop = (loop, callback)
    for sig in SIGNALS:
        signal.signal(sig, _remember)


def draining() -> None:
    """The drain has begun: a SIGHUP from now on has nothing to re-read, and must not end the process (exit 129)."""
    signal.signal(RELOAD, signal.SIG_IGN)


def done() -> None:
    """The server has stopped: a SIGTERM/SIGINT/SIGHUP from now until the exit changes nothing (Python would put back
    the default action while it shuts down; an ignored signal it leaves ignored)."""
    for sig in (*SIGNALS, RELOAD):
        signal.signal(sig, signal.SIG_IGN)


def reload_asked() -> bool:
    """A SIGHUP came before the event loop's handler: the models are re-read once serving."""
    return RELOAD in _received


def _remember(signum: int, frame) -> None:
    _received.add(signum)
    if _stop is not None and signum in SIGNALS:
        loop, callback = _stop
        try:
            loop.call_soon_threadsafe(callback)
        except RuntimeError:  # the loop has closed: the server has stopped already
            pass


def received() -> bool:
    return any(sig in SIGNALS for sig in _received)
