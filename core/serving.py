"""What every pdserve gRPC service has: health, reflection, metrics, graceful drain.

Health: `""` is liveness (SERVING while the process runs); the service's own name is readiness
(NOT_SERVING while loading or draining). On SIGTERM/SIGINT readiness goes NOT_SERVING first so
load balancers stop sending, then `server.stop(grace)` refuses new calls and gives in-flight ones
the grace period to finish.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from dataclasses import dataclass

import grpc
import prometheus_client
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

log = logging.getLogger(__name__)

LIVENESS = ""


@dataclass(frozen=True)
class ServerConfig:
    host: str
    port: int
    metrics_port: int
    drain_grace_seconds: float


class ServiceHost:
    """Owns one grpc.aio server; servicers are added to `server` before `start()`."""

    def __init__(self, config: ServerConfig, readiness_name: str, service_names: list[str]) -> None:
        self.config = config
        self.readiness_name = readiness_name
        self.server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
        self.health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        reflection.enable_server_reflection(
            [*service_names, health.SERVICE_NAME, reflection.SERVICE_NAME], self.server
        )
        self.draining = False
        self._stop = asyncio.Event()

    async def start(self) -> None:
        address = f"{self.config.host}:{self.config.port}"
        if self.server.add_insecure_port(address) == 0:
            raise OSError(f"port: cannot bind gRPC to {address}")
        prometheus_client.start_http_server(self.config.metrics_port, addr=self.config.host)
        await self.health.set(LIVENESS, health_pb2.HealthCheckResponse.SERVING)
        await self.set_ready(False)
        await self.server.start()
        log.info("serving %s on %s", self.readiness_name, address)

    async def set_ready(self, ready: bool) -> None:
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if ready
            else (health_pb2.HealthCheckResponse.NOT_SERVING)
        )
        await self.health.set(self.readiness_name, status)

    async def serve_until_signal(self) -> None:
        """Blocks until SIGTERM/SIGINT, then drains and stops the server."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stop.set)
        await self._stop.wait()
        await self.drain()

    def request_stop(self) -> None:
        self._stop.set()

    async def drain(self) -> None:
        self.draining = True
        await self.set_ready(False)
        log.info("draining: %.0fs for in-flight calls", self.config.drain_grace_seconds)
        await self.server.stop(self.config.drain_grace_seconds)
