"""`sampling.n` through router, prefill and decode processes: the router fans the samples out.

Each sample must equal a single-sample request with the derived seed (seed + index), in the unary
answer (`samples`) and in the stream (chunks tagged with `sample_index`); no block stays held.
"""

from __future__ import annotations

import asyncio

import grpc
import pytest

from pdserve.client import GenerationClient, SamplingParams, build_request
from pdserve.local.cluster import Cluster

from .helpers import wait_all_blocks_free

pytestmark = pytest.mark.integration

SEED = 1234


def sampled(seed: int, n: int = 1) -> SamplingParams:
    return SamplingParams(max_tokens=10, temperature=0.9, top_k=50, seed=seed, n=n, ignore_eos=True)


async def _run(
    address: str, prompt: list[int]
) -> tuple[list[list[int]], list[list[int]], list[list[int]]]:
    async with GenerationClient.connect(address) as client:
        many = await client.generate(build_request(prompt, sampling=sampled(SEED, 3)))
        singles = [
            await client.generate(build_request(prompt, sampling=sampled(SEED + i)))
            for i in range(3)
        ]
        streamed: list[list[int]] = [[], [], []]
        async for chunk in client.generate_stream(build_request(prompt, sampling=sampled(SEED, 3))):
            streamed[chunk.sample_index].extend(chunk.token_ids)
    assert list(many.token_ids) == list(many.samples[0].token_ids)
    assert [s.index for s in many.samples] == [0, 1, 2]
    return (
        [list(s.token_ids) for s in many.samples],
        [list(reply.token_ids) for reply in singles],
        streamed,
    )


def test_n_samples_equal_single_requests_with_derived_seeds(
    cluster: Cluster, prompts: list[list[int]]
) -> None:
    unary, singles, streamed = asyncio.run(_run(cluster.router.address, prompts[4]))
    assert unary == singles == streamed
    assert len({tuple(tokens) for tokens in unary}) > 1, "different seeds should differ"
    wait_all_blocks_free(cluster)


def test_too_many_samples_is_invalid_argument_naming_the_field(
    cluster: Cluster, prompts: list[list[int]]
) -> None:
    async def call() -> None:
        async with GenerationClient.connect(cluster.router.address) as client:
            await client.generate(build_request(prompts[1], sampling=sampled(SEED, 17)))

    with pytest.raises(grpc.aio.AioRpcError) as caught:
        asyncio.run(call())
    assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "sampling.n" in (caught.value.details() or "")
