"""What every pdserve gRPC service has: health, reflection, metrics, graceful drain.

Health: `""` is liveness (SERVING while the process runs); the service's own name is readiness
(NOT_SERVING while loading or draining). On SIGTERM/SIGINT readiness goes NOT_SERVING first so
load balancers stop sending; servicers refuse new work (UNAVAILABLE) while in-flight work gets up
to the grace period to finish; then the server stops.

Every server bounds message sizes (--max-message-bytes, both ways), refuses undecodable requests
with INVALID_ARGUMENT (`request_guard`), and serves TLS / mTLS when given certificates (`tls`).
With TLS on, --health-port serves the health service alone in plaintext, for probes that cannot
speak TLS (Kubernetes' gRPC probes); health carries no data and takes no work.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc
import prometheus_client
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from pdserve.core.serving.keepalive import Keepalive
from pdserve.core.serving.reflection import enable_reflection
from pdserve.core.serving.request_guard import RequestGuard
from pdserve.core.serving.tls import ServerTls, allowed_peers, server_credentials

log = logging.getLogger(__name__)

LIVENESS = ""
_DRAIN_POLL_S = 0.05
_FINAL_STOP_GRACE_S = 1.0
DEFAULT_MAX_MESSAGE_BYTES = 4 * 1024 * 1024  # grpc's own receive default, now for sends too
DRAIN_SECONDS = prometheus_client.Gauge(
    "pdserve_drain_seconds",
    "Seconds this process has been draining (since SIGTERM; 0 while serving): how long its "
    "in-flight work is taking to finish or move",
)


@dataclass(frozen=True)
class ServerConfig:
    host: str
    port: int
    metrics_port: int
    drain_grace_seconds: float
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    tls: ServerTls | None = None
    health_port: int | None = None  # plaintext health only; used when TLS is on
    keepalive: Keepalive = field(default_factory=Keepalive)

    def __post_init__(self) -> None:
        if self.max_message_bytes < 1:
            raise ValueError(f"--max-message-bytes: must be >= 1, got {self.max_message_bytes}")


def message_limits(max_bytes: int) -> list[tuple[str, int]]:
    """grpc options bounding each message either way (servers and the router's channels)."""
    return [
        ("grpc.max_receive_message_length", max_bytes),
        ("grpc.max_send_message_length", max_bytes),
    ]


class ServiceHost:
    """Owns one grpc.aio server; servicers are added to `server` before `start()`."""

    def __init__(self, config: ServerConfig, readiness_name: str, service_names: list[str]) -> None:
        self.config = config
        self.readiness_name = readiness_name
        names = config.tls.allowed_clients if config.tls is not None else ()
        check_peer = allowed_peers(names) if names else None
        self.server = grpc.aio.server(
            options=[
                ("grpc.so_reuseport", 0),
                *message_limits(config.max_message_bytes),
                *config.keepalive.server_options(),
            ],
            interceptors=[RequestGuard(check_peer)],
        )
        self.health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        self.health_server = self._plain_health_server()
        enable_reflection([*service_names, health.SERVICE_NAME], self.server)
        self.draining = False
        # Set once the drain has ended, just before the server stops: a long-lived stream with
        # nothing left in flight (a router's Multiplex) ends on it with OK, rather than being
        # cancelled by the stop (logged by grpc as an unhandled error).
        self.drained = asyncio.Event()
        self._drain_started: float | None = None
        self._drain_ended: float | None = None
        DRAIN_SECONDS.set_function(self._drain_seconds)
        self._stop = asyncio.Event()

    def _plain_health_server(self) -> grpc.aio.Server | None:
        if self.config.tls is None or self.config.health_port is None:
            return None
        server = grpc.aio.server(options=[("grpc.so_reuseport", 0)], interceptors=[RequestGuard()])
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        return server

    async def start(self) -> None:
        config = self.config
        address = f"{config.host}:{config.port}"
        if config.tls is None:
            bound = self.server.add_insecure_port(address)
        else:
            bound = self.server.add_secure_port(address, server_credentials(config.tls))
        if bound == 0:
            raise OSError(f"port: cannot bind gRPC to {address}")
        if self.health_server is not None:
            health_address = f"{config.host}:{config.health_port}"
            if self.health_server.add_insecure_port(health_address) == 0:
                raise OSError(f"health-port: cannot bind gRPC to {health_address}")
            await self.health_server.start()
        prometheus_client.start_http_server(config.metrics_port, addr=config.host)
        await self.health.set(LIVENESS, health_pb2.HealthCheckResponse.SERVING)
        await self.set_ready(False)
        await self.server.start()
        mode = "plaintext" if config.tls is None else "TLS"
        log.info("serving %s on %s (%s)", self.readiness_name, address, mode)

    def _drain_seconds(self) -> float:
        started = self._drain_started
        if started is None:
            return 0.0
        return (self._drain_ended or time.monotonic()) - started

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
        self._drain_started = time.monotonic()
        await self.set_ready(False)
        grace = self.config.drain_grace_seconds
        log.info("draining: up to %.0fs for in-flight work", grace)
        deadline = self._drain_started + grace
        while not is_idle() and time.monotonic() < deadline:
            await asyncio.sleep(_DRAIN_POLL_S)
        self._drain_ended = time.monotonic()
        log.info("drained in %.2f s (idle: %s)", self._drain_seconds(), is_idle())
        self.drained.set()
        await self.server.stop(_FINAL_STOP_GRACE_S)
        if self.health_server is not None:
            await self.health_server.stop(None)
