"""A queue a ZeroMQ poller can wait on: any thread put()s, the one thread that owns the sockets polls `fd` and take()s.

ZeroMQ sockets belong to one thread, so the engine thread's step reports (engine/remote/engine_process.py) and the
edge's
calls (engine/remote/remote_engine.py) reach the socket thread through one of these; a byte on a socket pair wakes its
poll.
"""
from __future__ import annotations

import collections
import socket
from typing import Any


class Mailbox:
    def __init__(self) -> None:
        self._items: collections.deque = collections.deque()  # append and popleft are atomic across threads
        self._read, self._write = socket.socketpair()
        self._read.setblocking(False)
        self._write.setblocking(False)

    @property
    def fd(self) -> int:
        return self._read.fileno()

    def put(self, item: Any) -> None:
        self._items.append(item)  # before the wake-up byte: a byte taken always has its item queued
        try:
            self._write.send(b"\0")
        except BlockingIOError:  # the pipe is full of wake-ups already: the owner is woken anyway
            pass

    def take(self) -> list:
        """Everything put so far, in order (the owner's thread only)."""
        try:
            while self._read.recv(4096):
                pass
        except BlockingIOError:
            pass
        out = []
        while self._items:
            out.append(self._items.popleft())
        return out

    def close(self) -> None:
        self._read.close()
        self._write.close()
