"""The edge interceptor: every Generation call grpc.aio hands to the server is counted in seqserve_requests_total,
those that end before their request is read included.

grpc.aio's own unary path reads a call's request before the handler runs; a call whose deadline passes or whose
client leaves meanwhile (an event loop too busy to take the request in time) ends there, unseen by the service. So
each unary-request handler is served here as a request-streaming one (the same bytes on the wire): the handler
starts the moment grpc.aio takes the call, reads the one request itself, and a call that ends during that read is
counted (DEADLINE_EXCEEDED when its deadline passed, else CANCELLED; model "", as it named none yet). A call that
got its request is counted by the service (service.py `_call`), once.

Core keeps the calls the event loop has not taken yet; one whose deadline passes there is still handed over when the
loop takes it, and counted here. What no interceptor can count is what core answers itself, Python never seeing the
call (grpc's src/core/server/server.cc): the calls past its pending-queue limit (--max-pending-calls) and those that
waited there longer than grpc.server_max_unrequested_time_in_server (30 s by default), both CANCELLED, and the calls
server.stop cancels (docs/security.md "Model repository and reload").
"""
from __future__ import annotations

import asyncio
import contextlib
import time

import grpc

from seqserve.server.inflight import Call
from seqserve.server.metrics import Metrics

Code = grpc.StatusCode


class Edge(grpc.aio.ServerInterceptor):
    def __init__(self, metrics: Metrics, counted_service: str) -> None:
        self.metrics, self.counted_service = metrics, counted_service
        self._served: dict[str, tuple[grpc.RpcMethodHandler, grpc.RpcMethodHandler]] = {}  # path -> (given, served)

    async def intercept_service(self, continuation, details: grpc.HandlerCallDetails):
        handler = await continuation(details)
        known = self._served.get(details.method)
        if known is not None and known[0] is handler:  # built once per method: no closures per call
            return known[1]
        service, _, method = details.method.lstrip("/").partition("/")
        if handler is None or service != self.counted_service or handler.request_streaming:
            return handler
        served = _reading(handler, lambda code: self.metrics.requests.labels("", method, code.name).inc())
        self._served[details.method] = handler, served
        return served


def _ended(context: grpc.aio.ServicerContext) -> grpc.StatusCode:
    """How a call that ended unread ends: its deadline, as the service computes it (inflight.Call), or the client."""
    return Code.DEADLINE_EXCEEDED if Call(context).expired(time.monotonic()) else Code.CANCELLED


def _reading(handler: grpc.RpcMethodHandler, unread) -> grpc.RpcMethodHandler:
    """The same handler served as request-streaming: it reads its one request, then runs as before."""

    async def read(context: grpc.aio.ServicerContext):
        try:
            request = await context.read()
        except asyncio.CancelledError:  # the client left or the deadline passed before the request arrived
            unread(_ended(context))
            raise
        if request is grpc.aio.EOF:  # the call ended with no request: grpc.aio's unary path ends it quietly too
            unread(_ended(context))
            raise asyncio.CancelledError
        return request

    if handler.response_streaming:
        behavior = handler.unary_stream

        async def stream(requests, context):
            request = await read(context)
            async with contextlib.aclosing(behavior(request, context)) as responses:  # closed with this one
                async for response in responses:
                    yield response

        return grpc.stream_stream_rpc_method_handler(stream, handler.request_deserializer,
                                                     handler.response_serializer)
    behavior = handler.unary_unary

    async def unary(requests, context):
        return await behavior(await read(context), context)

    return grpc.stream_unary_rpc_method_handler(unary, handler.request_deserializer, handler.response_serializer)
