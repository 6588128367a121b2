"""A free TCP port on 127.0.0.1, for a test process that must be told its port before it listens (nginx, prometheus,
locust's web UI). Servers that can bind port 0 and report it (seqserve serve, tests/grpc_harness.py) do that instead."""
from __future__ import annotations

import socket


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
