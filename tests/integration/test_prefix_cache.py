"""Prefix caching through real processes: the prefill tier skips a prefix it has computed before.

The router spreads requests over two prefill workers, so each prompt is sent twice in a row: at
least one worker sees it twice (the second time from its cache). Outputs must still be
transformers' greedy tokens, and every block is free (cached blocks count as free) afterwards,
also after a stream that shares its prefix is cancelled midway.
"""

from __future__ import annotations

import asyncio

import pytest

from pdserve.client import GenerationClient, SamplingParams, build_request
from pdserve.local.cluster import Cluster
from tests.oracle import SHARED_MAX_TOKENS

from .helpers import cancel_while_sharing, metric, wait_all_blocks_free

pytestmark = pytest.mark.integration

HIT_TOKENS = "pdserve_prefill_prefix_cache_hit_tokens"


async def _twice_each(address: str, prompts: list[list[int]]) -> list[list[list[int]]]:
    sampling = SamplingParams(max_tokens=SHARED_MAX_TOKENS, temperature=0.0)
    outputs = []
    async with GenerationClient.connect(address) as client:
        for prompt in prompts:
            replies = [
                await client.generate(build_request(prompt, sampling=sampling)) for _ in "ab"
            ]
            outputs.append([list(reply.token_ids) for reply in replies])
    return outputs


def test_prefill_reuses_cached_prefixes_and_matches_transformers(
    cluster: Cluster, shared_prompts: list[list[int]], shared_hf_greedy: list[list[int]]
) -> None:
    hits_before = sum(metric(worker, HIT_TOKENS) for worker in cluster.prefill)
    outputs = asyncio.run(_twice_each(cluster.router.address, shared_prompts))
    assert outputs == [[expected, expected] for expected in shared_hf_greedy]
    hits = sum(metric(worker, HIT_TOKENS) for worker in cluster.prefill) - hits_before
    assert hits > 0
    wait_all_blocks_free(cluster)


def test_cancel_of_a_stream_sharing_a_prefix_frees_every_block(
    cluster: Cluster, shared_prompts: list[list[int]]
) -> None:
    received = asyncio.run(cancel_while_sharing(cluster, shared_prompts[-1], shared_prompts[-2]))
    assert received >= 3
    wait_all_blocks_free(cluster)
