"""One unary gRPC call written out as HTTP/2 frames (h2), for what a gRPC client cannot show.

A gRPC client enforces its own deadline: the call ends on the client at the deadline whether or not the server
behind a balancer ever saw it. This client sends the grpc-timeout header and never enforces it, so the status that
comes back is the server's: DEADLINE_EXCEEDED only if the header crossed the balancer.
"""
from __future__ import annotations

import socket
import struct
from dataclasses import dataclass

import h2.config
import h2.connection
import h2.events


@dataclass
class Reply:
    status: int  # grpc-status
    message: str  # grpc-message
    body: bytes  # the response message, without gRPC's 5-byte length prefix


def unary(host: str, port: int, path: str, request: bytes, headers: list[tuple[str, str]],
          timeout: float = 30) -> Reply:
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
    with socket.create_connection((host, port), timeout=timeout) as sock:
        conn.initiate_connection()
        stream = conn.get_next_available_stream_id()
        conn.send_headers(stream, [(":method", "POST"), (":scheme", "http"), (":authority", f"{host}:{port}"),
                                   (":path", path), ("content-type", "application/grpc"), ("te", "trailers"),
                                   *headers])
        conn.send_data(stream, b"\x00" + struct.pack(">I", len(request)) + request, end_stream=True)
        sock.sendall(conn.data_to_send())
        fields, body = {}, b""
        ended = False
        while not ended:
            data = sock.recv(65536)
            if not data:
                break
            for event in conn.receive_data(data):
                if isinstance(event, (h2.events.ResponseReceived, h2.events.TrailersReceived)):
                    fields |= dict(event.headers)  # a trailers-only reply carries grpc-status in its headers
                elif isinstance(event, h2.events.DataReceived):
                    body += event.data
                    conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                elif isinstance(event, (h2.events.StreamEnded, h2.events.StreamReset)):
                    ended = True
            sock.sendall(conn.data_to_send())
    if "grpc-status" not in fields:
        raise AssertionError(f"no grpc-status in the reply: {fields}")
    return Reply(int(fields["grpc-status"]), fields.get("grpc-message", ""), body[5:])
