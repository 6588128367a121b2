"""The standard gRPC health service (grpcio's asyncio servicer), with a bound on open Watch streams.

Health answers without a token by default (probes carry none), so a Watch stream, which stays open until the client
leaves, is the one thing an unauthenticated client could hold without limit: beyond max_health_watches a new one
gets RESOURCE_EXHAUSTED (counted in seqserve_rejected_requests_total{reason="health_watches"}).
"""
from __future__ import annotations

import grpc
from grpc_health.v1 import health_pb2
from grpc_health.v1._async import HealthServicer

from seqserve.server.metrics import Metrics


class Health(HealthServicer):
    def __init__(self, max_watches: int, metrics: Metrics) -> None:
        super().__init__()
        self.max_watches, self.metrics = max_watches, metrics
        self.watches = 0  # Watch streams open now

    async def List(self, request, context) -> health_pb2.HealthListResponse:
        """Every service's status (grpcio's servicer leaves this newer method unimplemented: UNKNOWN, a traceback)."""
        return health_pb2.HealthListResponse(statuses={
            service: health_pb2.HealthCheckResponse(status=status) for service, status in self._server_status.items()})

    async def Watch(self, request, context) -> None:
        if self.watches >= self.max_watches:
            self.metrics.rejected.labels("", "health_watches").inc()  # server-wide: no model
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, f"too many health Watch streams open "
                                                                    f"(max_health_watches={self.max_watches})")
        self.watches += 1
        try:
            await super().Watch(request, context)
        finally:
            self.watches -= 1

    async def forget(self, service: str) -> None:
        """A service (an unloaded model) is gone: Watch streams see SERVICE_UNKNOWN, Check answers NOT_FOUND."""
        if self._gracefully_shutting_down:
            return
        await self._set(service, health_pb2.HealthCheckResponse.SERVICE_UNKNOWN)
        self._server_status.pop(service, None)
