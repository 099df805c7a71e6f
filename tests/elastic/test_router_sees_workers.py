"""A cluster is ready for a run only once its router counts every worker healthy: read from the
router's `pdserve_router_workers` gauge (here a stand-in metrics page, not a router)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Gauge, start_http_server

from pdserve.local.cluster import Process, router_healthy_workers, wait_ready, wait_router_sees
from pdserve.local.ports import free_port


@pytest.fixture
def router_page() -> Iterator[tuple[Process, Gauge]]:
    """A live process standing for the router, and the gauge its metrics page shows."""
    registry = CollectorRegistry()
    workers = Gauge("pdserve_router_workers", "", ["tier", "state"], registry=registry)
    port = free_port()
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


def test_a_process_that_exits_says_why_from_its_log(tmp_path: Path) -> None:
    """On a machine whose logs are gone after the run (CI), the error is all that is left."""
    log = tmp_path / "router-0.log"
    with log.open("wb") as output:
        failing = "import sys; print('line 1'); sys.exit('OSError: Failed to bind to 53020')"
        popen = subprocess.Popen([sys.executable, "-c", failing], stdout=output, stderr=output)
        popen.wait()
    router = Process("router", 0, free_port(), free_port(), popen, log=log)
    with pytest.raises(RuntimeError, match=r"router-0 exited \(1\); the end of its log:") as error:
        wait_ready([router], tls=None, timeout_s=5)
    assert str(error.value).splitlines()[-2:] == ["line 1", "OSError: Failed to bind to 53020"]
    assert str(Process("router", 0, 0, 0, popen).exited()) == "router-0 exited (1)"  # no log
