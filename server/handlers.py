"""The Generation service's handlers: the generated ones, with request decoders that never raise.

grpc.aio decodes a request before the handler runs; a DecodeError there (junk bytes, invalid UTF-8 in a string)
would end the call UNKNOWN with an ERROR traceback in the log. Here the decoder returns an Undecodable instead,
and the service answers it INVALID_ARGUMENT, counts it and logs one line.
"""
from __future__ import annotations

from dataclasses import dataclass

import grpc
from google.protobuf.message import DecodeError

from seqserve.v1 import seqserve_pb2_grpc as pb_grpc


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


def add_generation_service(servicer: pb_grpc.GenerationServicer, server: grpc.aio.Server) -> None:
    """What pb_grpc.add_GenerationServicer_to_server does, with the safe decoders."""
    capture = _Capture()
    pb_grpc.add_GenerationServicer_to_server(servicer, capture)
    handlers = {name: h._replace(request_deserializer=_safe(h.request_deserializer))
                for name, h in capture.handlers.items()}
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(capture.service, handlers),))
    server.add_registered_method_handlers(capture.service, handlers)
