"""Router -> prefill -> UCX -> decode, through real processes: outputs, KV bytes, block hygiene."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from pdserve.client import GenerationClient, SamplingParams, build_request
from pdserve.core.kv.block_pool import blocks_for
from pdserve.core.kv.cache import KVLayout
from pdserve.local.cluster import Cluster

from .helpers import cancel_stream_after, metric, wait_all_blocks_free

pytestmark = pytest.mark.integration


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0)


async def _unary_all(address: str, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    async with GenerationClient.connect(address) as client:
        replies = await asyncio.gather(
            *(client.generate(build_request(p, sampling=greedy(max_tokens))) for p in prompts)
        )
    return [list(reply.token_ids) for reply in replies]


async def _stream_all(address: str, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    async def one(client: GenerationClient, prompt: list[int]) -> list[int]:
        tokens: list[int] = []
        async for chunk in client.generate_stream(
            build_request(prompt, sampling=greedy(max_tokens))
        ):
            tokens.extend(chunk.token_ids)
        return tokens

    async with GenerationClient.connect(address) as client:
        return list(await asyncio.gather(*(one(client, p) for p in prompts)))


def test_unary_greedy_equals_transformers(
    cluster: Cluster, prompts: list[list[int]], hf_greedy: list[list[int]], max_new_tokens: int
) -> None:
    outputs = asyncio.run(_unary_all(cluster.router.address, prompts, max_new_tokens))
    assert outputs == hf_greedy
    wait_all_blocks_free(cluster)


def test_stream_greedy_equals_transformers(
    cluster: Cluster, prompts: list[list[int]], hf_greedy: list[list[int]], max_new_tokens: int
) -> None:
    outputs = asyncio.run(_stream_all(cluster.router.address, prompts, max_new_tokens))
    assert outputs == hf_greedy
    wait_all_blocks_free(cluster)


def test_kv_bytes_cross_ucx_exactly(cluster: Cluster, prompts: list[list[int]]) -> None:
    """Decode's received-bytes counter grows by the prompt's KV size (whole blocks, all layers),
    less the leading blocks decode's prefix cache held from the earlier tests' run of it."""
    prompt = prompts[5]  # 130 tokens: 9 blocks, the last one partly filled
    counters = ("pdserve_decode_kv_received_bytes", "pdserve_decode_kv_saved_bytes")
    before = sum(metric(process, name) for process in cluster.decode for name in counters)
    asyncio.run(_unary_all(cluster.router.address, [prompt], 4))
    after = sum(metric(process, name) for process in cluster.decode for name in counters)
    layout = KVLayout(num_layers=30, num_kv_heads=3, head_dim=64, block_size=16, dtype="float32")
    assert after - before == blocks_for(len(prompt), 16) * layout.block_nbytes
    wait_all_blocks_free(cluster)


def test_cancelled_stream_frees_blocks_on_both_tiers(
    cluster: Cluster, prompts: list[list[int]]
) -> None:
    assert asyncio.run(cancel_stream_after(cluster, prompts[6])) >= 3
    wait_all_blocks_free(cluster)


def test_deadline_gives_deadline_exceeded_and_frees_blocks(
    cluster: Cluster, prompts: list[list[int]]
) -> None:
    async def too_slow() -> None:
        sampling = SamplingParams(max_tokens=1000, temperature=0.0, ignore_eos=True)
        async with GenerationClient.connect(cluster.router.address) as client:
            await client.generate(build_request(prompts[4], sampling=sampling), timeout=1.5)

    with pytest.raises(grpc.aio.AioRpcError) as caught:
        asyncio.run(too_slow())
    assert caught.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
    wait_all_blocks_free(cluster)
