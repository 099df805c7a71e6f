"""Client ids collide harmlessly: the router runs every request under an id of its own.

Through the real tiers, behind the shared cluster's two router replicas. Before the router owned
the ids, each collision below was refused with ALREADY_EXISTS for an id the second client never
used, or overwrote the first stream's delivery on decode (router/validation.py).
"""

from __future__ import annotations

import asyncio

import pytest

from pdserve.client import GenerationClient, SamplingParams, build_request
from pdserve.local.cluster import Cluster
from pdserve.v1 import generation_pb2

from .helpers import wait_all_blocks_free

pytestmark = pytest.mark.integration


def _request(prompt: list[int], request_id: str, n: int = 1) -> generation_pb2.GenerateRequest:
    sampling = SamplingParams(max_tokens=24, temperature=0.0, n=n)
    return build_request(prompt, sampling=sampling, request_id=request_id)


async def _while_streaming(
    first: tuple[str, generation_pb2.GenerateRequest],
    others: tuple[str, list[generation_pb2.GenerateRequest]],
) -> tuple[list[generation_pb2.GenerateStreamResponse], list[generation_pb2.GenerateResponse]]:
    """`first` streamed through its router; `others` sent at once through theirs when the
    first's first chunk is here (the first then has most of its tokens still to come)."""
    async with (
        GenerationClient.connect(first[0]) as first_client,
        GenerationClient.connect(others[0]) as other_client,
    ):
        stream = first_client.generate_stream(first[1], timeout=120)
        chunks = [await anext(stream)]
        replies = await asyncio.gather(
            *(other_client.generate(request, timeout=120) for request in others[1])
        )
        chunks += [chunk async for chunk in stream]
    return chunks, list(replies)


def _tokens_by_sample(chunks: list[generation_pb2.GenerateStreamResponse]) -> list[list[int]]:
    samples: dict[int, list[int]] = {}
    for chunk in chunks:
        samples.setdefault(chunk.sample_index, []).extend(chunk.token_ids)
    return [samples[index] for index in sorted(samples)]


def test_a_clients_id_naming_anothers_sample_leaves_both_undisturbed(
    cluster: Cluster, prompts: list[list[int]], hf_greedy: list[list[int]]
) -> None:
    """Client A's "r" with n = 2 (its samples would be "r/0", "r/1") while client B sends "r/0"
    and "r/1"."""
    router = cluster.router.address
    first = (router, _request(prompts[2], "r", n=2))
    others = [_request(prompts[3], "r/0"), _request(prompts[4], "r/1")]
    chunks, replies = asyncio.run(_while_streaming(first, (router, others)))
    assert {chunk.request_id for chunk in chunks} == {"r"}
    assert _tokens_by_sample(chunks) == [hf_greedy[2], hf_greedy[2]]
    assert [reply.request_id for reply in replies] == ["r/0", "r/1"]
    assert [list(reply.token_ids) for reply in replies] == [hf_greedy[3], hf_greedy[4]]
    wait_all_blocks_free(cluster)


def test_two_router_replicas_given_the_same_client_id_serve_every_request(
    cluster: Cluster, prompts: list[list[int]], hf_greedy: list[list[int]]
) -> None:
    """One client streams "same-id" through replica 1; others send "same-id" twice at once
    through replica 2 (before, refused with ALREADY_EXISTS: an id they never used)."""
    one, other = (router.address for router in cluster.routers)
    first = (one, _request(prompts[4], "same-id"))
    others = [_request(prompts[5], "same-id"), _request(prompts[6], "same-id")]
    chunks, replies = asyncio.run(_while_streaming(first, (other, others)))
    assert {chunk.request_id for chunk in chunks} == {"same-id"}
    assert {reply.request_id for reply in replies} == {"same-id"}
    assert _tokens_by_sample(chunks) == [hf_greedy[4]]
    assert [list(reply.token_ids) for reply in replies] == [hf_greedy[5], hf_greedy[6]]
    wait_all_blocks_free(cluster)
