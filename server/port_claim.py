"""Only a server's own front ends share its port (--front-ends N).

Why this is needed: the front ends all listen on one port with SO_REUSEPORT (the kernel spreads connections over
them), and Linux lets any socket of the same user that sets SO_REUSEPORT too join that group. So a second server on
the same port, which without --front-ends fails with "address in use", would start and take a share of the
connections. Before the first front end binds, it therefore:

1. claims the port number: it binds an abstract Unix socket named after it (`@seqserve-port-N`). Two processes cannot
   bind one name, and the kernel frees it when the process dies, kill -9 included, so no file is left behind and no
   stale claim can block a restart. This closes the window between step 2 and the bind of two such servers started
   at once.
2. binds a probe socket to the port without SO_REUSEPORT and closes it. That bind fails with EADDRINUSE while any
   socket listens there, with SO_REUSEPORT or without: whoever holds the port, the server refuses to join it.

Its attached front ends do neither: they join on purpose. What this cannot stop is a program of the same user that
sets SO_REUSEPORT itself and binds after the server (the kernel cannot tell it apart without a BPF program, and that
user can signal the server's processes anyway); a server of another user can never join (the kernel refuses it).
The claim is per port number and per network namespace, so two --front-ends servers cannot share a port number
even on different addresses of one machine.
"""
from __future__ import annotations

import errno
import socket

CLAIM_NAME = "seqserve-port-{port}"  # an abstract Unix socket's name (no file): one server with front ends per port


class PortInUse(OSError):
    """The port is taken: by another server's claim, or by a socket listening on it."""


def claim_port(host: str, port: int) -> socket.socket:
    """The claim on this port (keep it open while serving; close it when done). PortInUse if the port is taken."""
    claim = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        claim.bind("\0" + CLAIM_NAME.format(port=port))
    except OSError as exc:
        claim.close()
        if exc.errno != errno.EADDRINUSE:
            raise
        raise PortInUse(f"address already in use: another seqserve server with front ends listens on port "
                        f"{port}") from None
    try:
        _probe(host, port)
    except BaseException:
        claim.close()
        raise
    return claim


def _probe(host: str, port: int) -> None:
    """PortInUse if a socket listens on host:port (every address the host stands for, as gRPC binds them)."""
    try:
        addresses = socket.getaddrinfo(host.strip("[]"), port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror:
        return  # gRPC's own bind reports an address that does not resolve
    for family, kind, proto, _, address in addresses:
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC does: TIME_WAIT is no listener
            if family == socket.AF_INET6:
                probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)  # dual stack, as gRPC binds [::]
            try:
                probe.bind(address)
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    raise PortInUse(f"address already in use: a server listens on {host}:{port}") from None
                # any other failure (an address this host does not have) is gRPC's to report
