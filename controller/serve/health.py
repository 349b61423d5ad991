"""The standard gRPC services next to the controller: grpc.health.v1 and server reflection.

Health answers for the whole server ("") and for each controller service name: NOT_SERVING until
the model is loaded and has run a forward pass, SERVING after, NOT_SERVING again from the moment
the server starts draining (probes take it out of rotation before any stream is ended).
"""

from __future__ import annotations

from collections.abc import Sequence

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
HEALTH_SERVICE = health.SERVICE_NAME  # grpc.health.v1.Health


class Health:
    """The server's health state, published through grpc.health.v1 (Check and Watch)."""

    def __init__(self, server: grpc.aio.Server, services: Sequence[str]) -> None:
        self.services = ("", *services)  # "": the server as a whole
        self._servicer = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self._servicer, server)

    async def _set_all(self, status: health_pb2.HealthCheckResponse.ServingStatus.ValueType) -> None:
        for name in self.services:
            await self._servicer.set(name, status)

    async def not_serving(self) -> None:
        await self._set_all(NOT_SERVING)

    async def serving(self) -> None:
        await self._set_all(SERVING)

    async def draining(self) -> None:
        """NOT_SERVING for good: later set() calls are ignored (Watch streams see the change)."""
        await self._set_all(NOT_SERVING)
        await self._servicer.enter_graceful_shutdown()


def enable_reflection(server: grpc.aio.Server, services: Sequence[str]) -> None:
    """Server reflection (grpcurl, Postman) for the given services, the health service and itself."""
    reflection.enable_server_reflection((*services, HEALTH_SERVICE, reflection.SERVICE_NAME), server)
