"""SIGTERM and SIGINT from the first moment of `seqserve serve`.

Importing onnxruntime and grpc takes about half a second, before the event loop (and its signal handlers) exists; a
signal then would end the process with Python's default action (exit -15). `hold` installs handlers that only
remember the signal; app._serve then stops at once (exit 0), or drains if the signal came while it was starting.
"""
from __future__ import annotations

import signal

SIGNALS = (signal.SIGTERM, signal.SIGINT)
_received: list[int] = []


def hold() -> None:
    """Remember SIGTERM/SIGINT until the event loop's handlers take over (call it before the slow imports)."""
    for sig in SIGNALS:
        signal.signal(sig, _remember)


def _remember(signum: int, frame) -> None:
    _received.append(signum)


def received() -> bool:
    return bool(_received)
