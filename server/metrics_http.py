"""The Prometheus /metrics endpoint: a small HTTP/1.1 server on the event loop, with no thread per connection.

It answers GET (and HEAD) of exactly `/metrics` (any query string) with the registry's exposition (the format the
scraper's Accept header asks for); any other path gets 404, any other method 405, anything that is not an HTTP
request 400. A connection has HEAD_TIMEOUT_SECONDS to send its request head (at most MAX_HEAD_BYTES) and
WRITE_TIMEOUT_SECONDS to take the answer; at most MAX_CONNECTIONS are open at once (a new one closes the oldest, so
idle connections cannot lock a scraper out). One request per connection (`Connection: close`), as Prometheus scrapes.
"""
from __future__ import annotations

import asyncio
import logging
import socket

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

log = logging.getLogger(__name__)

METRICS_PATH = "/metrics"
HEAD_TIMEOUT_SECONDS = 10.0  # Prometheus' default scrape timeout; a request head needs a fraction of it
WRITE_TIMEOUT_SECONDS = 10.0
MAX_HEAD_BYTES = 16 * 1024
MAX_CONNECTIONS = 64  # a scraper uses one at a time; the rest is headroom for several scrapers and curl


class MetricsEndpoint:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.address: tuple | None = None  # (host, port, ...) once listening
        self.connections: dict[asyncio.StreamWriter, None] = {}  # open ones, oldest first
        self._server: asyncio.base_events.Server | None = None

    @property
    def port(self) -> int:
        return self.address[1]

    async def start(self, host: str, port: int) -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._server = await asyncio.start_server(self._serve, host, port, family=family, limit=MAX_HEAD_BYTES,
                                                  reuse_address=True)
        self.address = self._server.sockets[0].getsockname()

    async def close(self) -> None:
        if self._server is None:
            return
        self._server.close()
        for writer in list(self.connections):  # half-sent requests must not hold the shutdown up
            writer.transport.abort()
        await self._server.wait_closed()
        self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if len(self.connections) >= MAX_CONNECTIONS:  # the oldest goes: idle connections cannot lock a scraper out
            oldest = next(iter(self.connections))
            del self.connections[oldest]
            oldest.transport.abort()
        self.connections[writer] = None
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HEAD_TIMEOUT_SECONDS)
            status, content_type, body, send_body = self._answer(head)
            writer.write(f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {len(body)}\r\n"
                         f"Connection: close\r\n\r\n".encode("latin-1") + (body if send_body else b""))
            await asyncio.wait_for(writer.drain(), WRITE_TIMEOUT_SECONDS)
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError) as exc:
            log.debug("metrics connection ended without an answer: %s", type(exc).__name__)  # slow or gone: normal
        except Exception as exc:  # one line, never a traceback per connection
            log.warning("metrics request failed: %s", exc)
        finally:
            self.connections.pop(writer, None)
            writer.close()

    def _answer(self, head: bytes) -> tuple[str, str, bytes, bool]:
        """(status line, content type, body, whether to send the body) for one request head."""
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/"):
            return "400 Bad Request", "text/plain", b"not an HTTP request\n", True
        method, target, _ = parts
        if method not in ("GET", "HEAD"):
            return "405 Method Not Allowed", "text/plain", b"only GET and HEAD\n", True
        if target.split("?", 1)[0] != METRICS_PATH:
            return "404 Not Found", "text/plain", f"only {METRICS_PATH} is served here\n".encode(), method == "GET"
        headers = dict(line.split(":", 1) for line in lines[1:] if ":" in line)
        accept = next((v.strip() for k, v in headers.items() if k.strip().lower() == "accept"), "")
        encoder, content_type = choose_encoder(accept)
        return "200 OK", content_type, encoder(self.registry), method == "GET"
