"""Every service's handlers with request decoders that never raise: the generated ones (Generation, health,
reflection), re-registered with safe decoders.

grpc.aio decodes a request before the handler runs; a DecodeError there (junk bytes, invalid UTF-8 in a string)
would end the call UNKNOWN with an ERROR traceback in the log. Here the decoder returns an Undecodable instead. The
Generation service answers it itself (INVALID_ARGUMENT, counted, one log line); for health and reflection, whose
servicers come from grpcio, `add_refusing` wraps each method so that an Undecodable gets the same answer and line.
"""
from __future__ import annotations

import inspect
import logging
from dataclasses import dataclass

import grpc
from google.protobuf.message import DecodeError

from seqserve.v1 import seqserve_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Undecodable:
    """What the handler receives in place of a request that could not be decoded."""

    size: int  # bytes received
    reason: str  # protobuf's message, e.g. "String field had bad UTF-8"


def _safe(decode):
    def safe_decode(raw: bytes):
        try:
            return decode(raw)
        except DecodeError as exc:
            return Undecodable(len(raw), str(exc).rpartition(": ")[2] or "malformed message")

    return safe_decode


class _Capture:
    """Stands in for a server so the generated add_*_to_server hands over its handlers."""

    def __init__(self) -> None:
        self.service, self.handlers = "", {}

    def add_generic_rpc_handlers(self, handlers) -> None:
        pass

    def add_registered_method_handlers(self, service: str, handlers: dict) -> None:
        self.service, self.handlers = service, handlers


def _register(add_to_server, servicer, server: grpc.aio.Server, wrap=None) -> None:
    """What add_to_server(servicer, server) does, with safe decoders (and each handler passed through wrap)."""
    capture = _Capture()
    add_to_server(servicer, capture)
    handlers = {name: h._replace(request_deserializer=_safe(h.request_deserializer))
                for name, h in capture.handlers.items()}
    if wrap is not None:
        handlers = {name: wrap(name, h) for name, h in handlers.items()}
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(capture.service, handlers),))
    server.add_registered_method_handlers(capture.service, handlers)


def add_generation_service(servicer: pb_grpc.GenerationServicer, server: grpc.aio.Server) -> None:
    """What pb_grpc.add_GenerationServicer_to_server does, with the safe decoders (the service answers them)."""
    _register(pb_grpc.add_GenerationServicer_to_server, servicer, server)


def add_refusing(add_to_server, servicer, server: grpc.aio.Server) -> None:
    """A grpcio servicer (health, reflection) whose undecodable requests get INVALID_ARGUMENT and one warning."""
    _register(add_to_server, servicer, server, wrap=_refusing)


async def refuse(method: str, request: Undecodable, context: grpc.aio.ServicerContext) -> None:
    log.warning("%s: refused a request that cannot be decoded (%d bytes): %s", method, request.size, request.reason)
    await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                        f"the request is not a valid {method} message: {request.reason}")


def _refusing(method: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    kind = {(False, False): "unary_unary", (False, True): "unary_stream", (True, False): "stream_unary",
            (True, True): "stream_stream"}[(bool(handler.request_streaming), bool(handler.response_streaming))]
    behavior = getattr(handler, kind)
    if handler.request_streaming:
        async def checked(requests, context):
            async for request in requests:
                if isinstance(request, Undecodable):
                    await refuse(method, request, context)
                yield request

        if inspect.isasyncgenfunction(behavior):
            async def wrapped(requests, context):
                async for response in behavior(checked(requests, context), context):
                    yield response
        else:
            async def wrapped(requests, context):
                return await behavior(checked(requests, context), context)
    elif inspect.isasyncgenfunction(behavior):
        async def wrapped(request, context):
            if isinstance(request, Undecodable):
                await refuse(method, request, context)
            async for response in behavior(request, context):
                yield response
    else:  # a coroutine (unary, or a stream written with context.write, as grpcio's health Watch is)
        async def wrapped(request, context):
            if isinstance(request, Undecodable):
                await refuse(method, request, context)
            return await behavior(request, context)
    return handler._replace(**{kind: wrapped})
