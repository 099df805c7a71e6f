"""A cluster is ready for a run only once its router counts every worker healthy: read from the
router's `pdserve_router_workers` gauge (here a stand-in metrics page, not a router)."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry, Gauge, start_http_server

from pdserve.local.cluster import Process, router_healthy_workers, wait_router_sees


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def router_page() -> Iterator[tuple[Process, Gauge]]:
    """A live process standing for the router, and the gauge its metrics page shows."""
    registry = CollectorRegistry()
    workers = Gauge("pdserve_router_workers", "", ["tier", "state"], registry=registry)
    port = _free_port()
    server, thread = start_http_server(port, addr="127.0.0.1", registry=registry)
    popen = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        yield Process("router", 0, 0, port, popen), workers
    finally:
        popen.kill()
        popen.wait()
        server.shutdown()
        thread.join()


def test_counts_per_tier_are_read_from_the_gauge(router_page: tuple[Process, Gauge]) -> None:
    router, workers = router_page
    workers.labels("decode", "known").set(2)
    workers.labels("decode", "healthy").set(1)
    workers.labels("prefill", "healthy").set(1)
    assert router_healthy_workers(router) == {"decode": 1, "prefill": 1}
    wait_router_sees(router, {"prefill": 1, "decode": 1}, timeout_s=5)


def test_waits_until_every_worker_is_healthy(router_page: tuple[Process, Gauge]) -> None:
    router, workers = router_page
    workers.labels("decode", "healthy").set(1)
    with pytest.raises(TimeoutError, match="healthy workers"):
        wait_router_sees(router, {"prefill": 0, "decode": 2}, timeout_s=1)
    workers.labels("decode", "healthy").set(2)
    wait_router_sees(router, {"prefill": 0, "decode": 2}, timeout_s=5)
