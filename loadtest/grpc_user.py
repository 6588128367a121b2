"""A locust User that speaks gRPC: one channel per user, every call reported as a locust request event.

Import it only inside a locust process: it switches grpc to gevent, which locust has already patched in.
The channel follows the locustfile's connection flags (--ca-file, --cert-file, --key-file, --tls, --tls-server-name,
--token-file, or SEQSERVE_TOKEN): TLS, mutual TLS and bearer tokens, as every seqserve client.
Events: request_type "grpc" for whole calls (name = method, response_length = usage.generated_tokens, so
locust's content size totals are generated tokens) and "ttft" for a stream's time to its first token.
"""
from __future__ import annotations

import time

import grpc
import grpc.experimental.gevent
from locust import User

from seqserve.client.channel import Connection, connection_from_args
from seqserve.loadtest.summary import CALL, FIRST_TOKEN
from seqserve.v1 import seqserve_pb2 as pb
from seqserve.v1 import seqserve_pb2_grpc as pb_grpc

grpc.experimental.gevent.init_gevent()  # grpc's blocking calls must yield to the other users' greenlets


class RpcFailure(Exception):
    """A failed call. Its repr is the status code name alone: locust keys failures by repr, so they group by code."""

    def __init__(self, code: str, details: str = "") -> None:
        super().__init__(f"{code}: {details}" if details else code)
        self.code = code

    def __repr__(self) -> str:
        return self.code

    @classmethod
    def of(cls, exc: grpc.RpcError) -> RpcFailure:
        return cls(exc.code().name, exc.details() or "")


class GrpcUser(User):
    abstract = True

    def on_start(self) -> None:
        if not self.host:
            raise ValueError("no target: pass --host host:port (the gRPC server)")
        options = getattr(self.environment, "parsed_options", None)
        connection = connection_from_args(options) if options is not None else Connection()
        self.channel = connection.channel(self.host)
        self.stub = pb_grpc.GenerationStub(self.channel)

    def on_stop(self) -> None:
        self.channel.close()

    def generate(self, request: pb.GenerateRequest, timeout: float | None = None) -> pb.GenerateResponse | None:
        """One unary call, reported as ("grpc", "Generate"); None when it failed."""
        start = time.perf_counter()
        try:
            response = self.stub.Generate(request, timeout=timeout)
        except grpc.RpcError as exc:
            self._report(CALL, "Generate", start, failure=RpcFailure.of(exc))
            return None
        self._report(CALL, "Generate", start, tokens=response.usage.generated_tokens)
        return response

    def generate_stream(self, request: pb.GenerateRequest, timeout: float | None = None) -> int | None:
        """One stream, reported twice: ("ttft", ...) at its first token and ("grpc", ...) at its end.

        Returns the generated token count, None when it failed.
        """
        start, first_seen, last = time.perf_counter(), False, None
        try:
            for message in self.stub.GenerateStream(request, timeout=timeout):
                if message.token_ids and not first_seen:
                    first_seen = True
                    self._report(FIRST_TOKEN, "GenerateStream", start)
                last = message
        except grpc.RpcError as exc:
            self._report(CALL, "GenerateStream", start, failure=RpcFailure.of(exc))
            return None
        if last is None or not last.finish_reason:  # OK status without the summary message breaks the API contract
            self._report(CALL, "GenerateStream", start, failure=RpcFailure("INCOMPLETE_STREAM", "no final message"))
            return None
        self._report(CALL, "GenerateStream", start, tokens=last.usage.generated_tokens)
        return last.usage.generated_tokens

    def _report(self, kind: str, name: str, start: float, tokens: int = 0, failure: Exception | None = None) -> None:
        self.environment.events.request.fire(request_type=kind, name=name, response_length=tokens,
                                             response_time=(time.perf_counter() - start) * 1e3,
                                             exception=failure, context={})
