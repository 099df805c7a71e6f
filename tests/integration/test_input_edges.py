"""Input edges through the real router (issue 9, item 4): non-finite sampling numbers, a request
that can never fit a worker's KV cache, and undecodable request bytes."""

from __future__ import annotations

import asyncio
import math

import grpc
import pytest

from pdserve.client import GenerationClient, SamplingParams, build_request
from pdserve.local.cluster import Cluster
from pdserve.v1 import generation_pb2

from .conftest import WORKER_ARGS
from .helpers import wait_all_blocks_free

pytestmark = pytest.mark.integration

NON_FINITE = [
    ("sampling.temperature", SamplingParams(temperature=math.inf)),
    ("sampling.temperature", SamplingParams(temperature=math.nan)),
    ("sampling.top_p", SamplingParams(top_p=math.nan)),
    ("sampling.top_p", SamplingParams(top_p=-math.inf)),
]
# The workers' cache holds --num-kv-blocks x 16 tokens: within the model's 8192-token context,
# more than that can never be held at once by one decode worker.
KV_TOKENS = int(WORKER_ARGS[WORKER_ARGS.index("--num-kv-blocks") + 1]) * 16
GARBAGE = b"\xff\xff\xff\xff\x0f"


async def refusal(address: str, request: generation_pb2.GenerateRequest) -> grpc.aio.AioRpcError:
    async with GenerationClient.connect(address) as client:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await client.generate(request, timeout=60)
        return caught.value


@pytest.mark.parametrize(("field", "sampling"), NON_FINITE)
def test_non_finite_numbers_are_refused_naming_the_field(
    cluster: Cluster, field: str, sampling: SamplingParams
) -> None:
    error = asyncio.run(refusal(cluster.router.address, build_request("Hi", sampling=sampling)))
    assert error.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert (error.details() or "").startswith(f"{field}: must be a finite number")


def test_a_request_that_can_never_fit_the_kv_cache_names_max_tokens(cluster: Cluster) -> None:
    """INVALID_ARGUMENT, not RESOURCE_EXHAUSTED: no retry can ever succeed (docs/api.md)."""
    sampling = SamplingParams(max_tokens=KV_TOKENS + 100)
    assert KV_TOKENS + 200 < 8192  # inside the model's context: only the cache is too small
    error = asyncio.run(refusal(cluster.router.address, build_request("Hi", sampling=sampling)))
    assert error.code() is grpc.StatusCode.INVALID_ARGUMENT
    details = error.details() or ""
    assert details.startswith("sampling.max_tokens: ") and "KV blocks" in details
    wait_all_blocks_free(cluster)


def test_undecodable_bytes_are_invalid_argument_and_logged_once(cluster: Cluster) -> None:
    assert cluster.log_dir is not None
    log_path = cluster.log_dir / "router-0.log"
    logged_before = log_path.stat().st_size

    async def flood() -> list[grpc.StatusCode]:
        codes = []
        async with grpc.aio.insecure_channel(cluster.router.address) as channel:
            # No serializers: the bytes go out as they are.
            call: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(
                "/pdserve.v1.Generation/Generate"
            )
            for _ in range(40):
                try:
                    await call(GARBAGE, timeout=30)
                except grpc.aio.AioRpcError as error:
                    codes.append(error.code())
                    assert (error.details() or "").startswith("request: ")
        return codes

    assert asyncio.run(flood()) == [grpc.StatusCode.INVALID_ARGUMENT] * 40
    with open(log_path, "rb") as log:
        log.seek(logged_before)
        new_lines = log.read().decode(errors="replace")
    assert "Traceback" not in new_lines
    # One line per 10 s at most: the flood takes far less than 20 s.
    assert 1 <= new_lines.count("undecodable request") <= 2
