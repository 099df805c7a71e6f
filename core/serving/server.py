"""What every pdserve gRPC service has: health, reflection, metrics, graceful drain.

Health: `""` is liveness (SERVING while the process runs); the service's own name is readiness
(NOT_SERVING while loading or draining). On SIGTERM/SIGINT readiness goes NOT_SERVING first so
load balancers stop sending; servicers refuse new work (UNAVAILABLE) while in-flight work gets up
to the grace period to finish; then the server stops.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass

import grpc
import prometheus_client
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

log = logging.getLogger(__name__)

LIVENESS = ""
_DRAIN_POLL_S = 0.05
_FINAL_STOP_GRACE_S = 1.0


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

    async def serve_until_signal(self, is_idle: Callable[[], bool] = lambda: True) -> None:
        """Blocks until SIGTERM/SIGINT (or `request_stop`), then drains and stops the server."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stop.set)
        await self._stop.wait()
        await self.drain(is_idle)

    def request_stop(self) -> None:
        self._stop.set()

    async def drain(self, is_idle: Callable[[], bool]) -> None:
        """Readiness off, new work refused (servicers check `draining`), in-flight work gets up to
        the grace period: calls that belong to it (a decode stream after its reservation) still
        arrive, which is why the server is not stopped until then."""
        self.draining = True
        await self.set_ready(False)
        grace = self.config.drain_grace_seconds
        log.info("draining: up to %.0fs for in-flight work", grace)
        deadline = time.monotonic() + grace
        while not is_idle() and time.monotonic() < deadline:
            await asyncio.sleep(_DRAIN_POLL_S)
        await self.server.stop(_FINAL_STOP_GRACE_S)
