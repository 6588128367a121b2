"""Bearer-token authentication: a grpc.aio server interceptor that refuses calls without an accepted token.

A call carries `authorization: Bearer <token>` metadata (the scheme in any case, as RFC 7235 has it; whitespace
around the token is stripped). Tokens are compared as SHA-256 digests with
hmac.compare_digest against every accepted token (no early exit), so neither the content nor the length of an
accepted token leaks through timing. Refused calls get UNAUTHENTICATED before their request is even decoded.
"""
from __future__ import annotations

import hashlib
import hmac
import logging

import grpc

from seqserve.client.channel import AUTHORIZATION, BEARER
from seqserve.server.metrics import Metrics

log = logging.getLogger(__name__)

HEALTH_SERVICE = "grpc.health.v1.Health"


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


class TokenAuth(grpc.aio.ServerInterceptor):
    def __init__(self, tokens: frozenset[str], metrics: Metrics, counted_service: str,
                 exempt_health: bool = True) -> None:
        """counted_service: calls to this service that are refused count in seqserve_requests_total (by method)."""
        if not tokens:
            raise ValueError("TokenAuth needs at least one token")
        self._digests = [_digest(t) for t in tokens]
        self.metrics, self.counted_service, self.exempt_health = metrics, counted_service, exempt_health

    def accepts(self, metadata) -> bool:
        presented = next((v for k, v in metadata or () if k == AUTHORIZATION), None)
        if not isinstance(presented, str):
            return False
        scheme, _, token = presented.strip().partition(" ")
        if scheme.lower() != BEARER.strip().lower():  # auth schemes are case-insensitive (RFC 7235)
            return False
        digest, ok = _digest(token.strip()), False
        for accepted in self._digests:
            ok |= hmac.compare_digest(digest, accepted)
        return ok

    async def intercept_service(self, continuation, details: grpc.HandlerCallDetails):
        service, _, method = details.method.lstrip("/").partition("/")
        if (self.exempt_health and service == HEALTH_SERVICE) or self.accepts(details.invocation_metadata):
            return await continuation(details)
        handler = await continuation(details)
        if handler is None:  # unknown method: UNIMPLEMENTED, as without auth
            return None
        if service == self.counted_service:
            self.metrics.requests.labels("", method, grpc.StatusCode.UNAUTHENTICATED.name).inc()  # model: not known yet
            self.metrics.rejected.labels("", "unauthenticated").inc()
        log.debug("refused %s: missing or wrong bearer token", details.method)
        return _refusal(handler)


_MESSAGE = "missing or wrong bearer token (metadata `authorization: Bearer <token>`)"


async def _deny(request_or_iterator, context: grpc.aio.ServicerContext):
    await context.abort(grpc.StatusCode.UNAUTHENTICATED, _MESSAGE)


def _ignore(raw: bytes) -> None:
    """A refused call's request is never decoded: junk from an unauthenticated client costs nothing."""
    return None


def _refusal(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    """A handler of the same kind (unary/stream on each side) that answers UNAUTHENTICATED."""
    make = {(False, False): grpc.unary_unary_rpc_method_handler, (False, True): grpc.unary_stream_rpc_method_handler,
            (True, False): grpc.stream_unary_rpc_method_handler, (True, True): grpc.stream_stream_rpc_method_handler}
    kind = (bool(handler.request_streaming), bool(handler.response_streaming))
    return make[kind](_deny, request_deserializer=_ignore, response_serializer=handler.response_serializer)
