"""`pdserve_drain_seconds`: 0 while serving, then how long the drain took, held once it ended
(a real ServiceHost on 127.0.0.1, in this process)."""

from __future__ import annotations

import asyncio
import time

import prometheus_client

from pdserve.core.serving.server import ServerConfig, ServiceHost
from pdserve.local.ports import free_port

HOST = "127.0.0.1"
BUSY_S = 0.3


def _drain_seconds() -> float:
    value = prometheus_client.REGISTRY.get_sample_value("pdserve_drain_seconds")
    assert value is not None
    return value


def test_the_drain_is_timed_from_sigterm_to_idle() -> None:
    async def scenario() -> tuple[float, float, float]:
        config = ServerConfig(HOST, free_port(), free_port(), drain_grace_seconds=10.0)
        host = ServiceHost(config, "pdserve.test.Service", ["pdserve.test.Service"])
        await host.start()
        serving = _drain_seconds()
        idle_at = time.monotonic() + BUSY_S  # in-flight work that ends after BUSY_S
        await host.drain(lambda: time.monotonic() >= idle_at)
        drained = _drain_seconds()
        await asyncio.sleep(0.2)
        return serving, drained, _drain_seconds()

    serving, drained, later = asyncio.run(scenario())
    assert serving == 0.0
    assert BUSY_S <= drained < 10.0  # the work's time, not the grace
    assert later == drained  # held at the drain's length after it ended
