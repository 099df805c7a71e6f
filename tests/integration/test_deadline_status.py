"""A call whose deadline passed is counted DEADLINE_EXCEEDED in the router's requests metric,
never CANCELLED (issue 9, item 5; docs/contract.md), at whatever stage the deadline hits, and
frees its blocks on every tier (on the shared cluster, which the next tests find as it was)."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest

from pdserve.client import GenerationClient, SamplingParams, build_request
from pdserve.local.cluster import Cluster

from .helpers import labelled_metric, wait_all_blocks_free

pytestmark = pytest.mark.integration

REQUESTS = "pdserve_router_requests_total"
NUM_CALLS = 20


def counted(cluster: Cluster, code: str) -> float:
    return labelled_metric(cluster.router, REQUESTS, code=code, method="Generate")


def test_expired_deadlines_are_counted_deadline_exceeded(cluster: Cluster) -> None:
    before = {code: counted(cluster, code) for code in ("DEADLINE_EXCEEDED", "CANCELLED")}
    sampling = SamplingParams(max_tokens=400, ignore_eos=True)

    async def calls() -> list[grpc.StatusCode]:
        async with GenerationClient.connect(cluster.router.address) as client:

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
    while sum(counted(cluster, code) - before[code] for code in before) < NUM_CALLS:
        assert time.monotonic() < end, "the router did not count every call"
        time.sleep(0.2)
    assert counted(cluster, "DEADLINE_EXCEEDED") - before["DEADLINE_EXCEEDED"] == NUM_CALLS
    assert counted(cluster, "CANCELLED") == before["CANCELLED"]
    # Deadlines at every stage (queued, prefilling, reserved, decoding) leave the shared cluster
    # as they found it: no tier keeps a block for them.
    wait_all_blocks_free(cluster)
