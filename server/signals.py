"""SIGTERM and SIGINT (and SIGHUP, which re-reads the models) from the first moment of `seqserve serve`.

Importing onnxruntime and grpc takes about half a second, before the event loop (and its signal handlers) exists; a
signal then would end the process with Python's default action (exit -15). `hold` installs handlers that only
remember the signal; app._serve then stops at once (exit 0), or drains if the signal came while it was starting.
"""
from __future__ import annotations

import signal

SIGNALS = (signal.SIGTERM, signal.SIGINT)
RELOAD = signal.SIGHUP  # re-read the models (its default action would end the process)
_received: list[int] = []


def hold() -> None:
    """Remember SIGTERM/SIGINT/SIGHUP until the event loop's handlers take over (call it before the slow imports)."""
    for sig in (*SIGNALS, RELOAD):
        signal.signal(sig, _remember)


def reload_asked() -> bool:
    """A SIGHUP came before the event loop's handler: the models are re-read once serving."""
    return RELOAD in _received


def _remember(signum: int, frame) -> None:
    _received.append(signum)


def received() -> bool:
    return any(sig in SIGNALS for sig in _received)
