"""A call whose deadline passed is counted DEADLINE_EXCEEDED in the router's requests metric,
never CANCELLED (issue 9, item 5; docs/contract.md), at whatever stage the deadline hits."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from pdserve.client import GenerationClient, SamplingParams, build_request
from pdserve.local.cluster import Cluster

from .conftest import start_cluster
from .helpers import labelled_metric

pytestmark = pytest.mark.integration

REQUESTS = "pdserve_router_requests_total"
NUM_CALLS = 20


@pytest.fixture(scope="module")
def small_cluster(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    # Its own cluster: a deadline during prefill may hold a reservation for a while, which must
    # not leak into the shared cluster's no-leak checks.
    running = start_cluster(model_dir, tmp_path_factory.mktemp("deadline-logs"), 1, 1)
    yield running
    running.stop()


def counted(cluster: Cluster, code: str) -> float:
    return labelled_metric(cluster.router, REQUESTS, code=code, method="Generate")


def test_expired_deadlines_are_counted_deadline_exceeded(small_cluster: Cluster) -> None:
    before = {code: counted(small_cluster, code) for code in ("DEADLINE_EXCEEDED", "CANCELLED")}
    sampling = SamplingParams(max_tokens=400, ignore_eos=True)

    async def calls() -> list[grpc.StatusCode]:
        async with GenerationClient.connect(small_cluster.router.address) as client:

            async def one(index: int) -> grpc.StatusCode:
                request = build_request(f"Deadline number {index}:", sampling=sampling)
                try:
                    await client.generate(request, timeout=0.2 + 0.1 * index)
                except grpc.aio.AioRpcError as error:
                    return error.code()
                return grpc.StatusCode.OK

            return list(await asyncio.gather(*(one(i) for i in range(NUM_CALLS))))

    codes = asyncio.run(calls())
    assert codes == [grpc.StatusCode.DEADLINE_EXCEEDED] * NUM_CALLS
    end = time.monotonic() + 30
    while sum(counted(small_cluster, code) - before[code] for code in before) < NUM_CALLS:
        assert time.monotonic() < end, "the router did not count every call"
        time.sleep(0.2)
    assert counted(small_cluster, "DEADLINE_EXCEEDED") - before["DEADLINE_EXCEEDED"] == NUM_CALLS
    assert counted(small_cluster, "CANCELLED") == before["CANCELLED"]
