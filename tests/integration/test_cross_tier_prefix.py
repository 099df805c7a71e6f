"""The cross-tier prefix cache through real processes (router, 1 prefill, 2 decode, UCX), under
both routing policies: decode holds a prompt's leading blocks from an earlier request, tells
prefill so in the reservation, and only the missing blocks cross UCX.

Requests run one after another, so each one's KV bytes are the counters' growth in between.
Under `--routing-policy prefix` every repeat of a shared prefix lands on the decode worker that
holds it (bytes saved for each); least-loaded spreads the same requests over both workers.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from pdserve.client import GenerationClient, SamplingParams, build_request
from pdserve.core.kv.block_pool import blocks_for
from pdserve.core.kv.cache import KVLayout
from pdserve.local.cluster import Cluster
from tests.oracle import SHARED_MAX_TOKENS

from .conftest import start_cluster
from .helpers import cancel_while_sharing, metric, wait_all_blocks_free

pytestmark = pytest.mark.integration

LAYOUT = KVLayout(num_layers=30, num_kv_heads=3, head_dim=64, block_size=16, dtype="float32")
BLOCK_NBYTES = int(LAYOUT.block_nbytes)
SHARED_BLOCKS = 6  # shared_prompts[6:9] share 100 tokens: six full blocks
RECEIVED = "pdserve_decode_kv_received_bytes"
SAVED = "pdserve_decode_kv_saved_bytes"
SENT = "pdserve_prefill_kv_sent_bytes"


@pytest.fixture(scope="module", params=["prefix", "least-loaded"])
def policy_cluster(
    request: pytest.FixtureRequest, model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    policy = str(request.param)
    logs = tmp_path_factory.mktemp(f"cross-tier-{policy}")
    running = start_cluster(model_dir, logs, 1, 2, router_args=("--routing-policy", policy))
    yield running
    running.stop()


@dataclass(frozen=True)
class Counters:
    received: tuple[float, ...]  # per decode worker
    saved: tuple[float, ...]
    sent: float

    @staticmethod
    def read(cluster: Cluster) -> Counters:
        return Counters(
            tuple(metric(worker, RECEIVED) for worker in cluster.decode),
            tuple(metric(worker, SAVED) for worker in cluster.decode),
            metric(cluster.prefill[0], SENT),
        )

    def minus(self, before: Counters) -> Counters:
        return Counters(
            tuple(a - b for a, b in zip(self.received, before.received, strict=True)),
            tuple(a - b for a, b in zip(self.saved, before.saved, strict=True)),
            self.sent - before.sent,
        )


def _one_by_one(cluster: Cluster, prompts: list[list[int]]) -> list[tuple[list[int], Counters]]:
    """Each prompt's greedy tokens and the counters' growth while it ran."""

    async def run() -> list[tuple[list[int], Counters]]:
        sampling = SamplingParams(max_tokens=SHARED_MAX_TOKENS, temperature=0.0)
        results = []
        async with GenerationClient.connect(cluster.router.address) as client:
            for prompt in prompts:
                before = Counters.read(cluster)
                reply = await client.generate(build_request(prompt, sampling=sampling))
                results.append((list(reply.token_ids), Counters.read(cluster).minus(before)))
        return results

    return asyncio.run(run())


def _cacheable(prompt: list[int]) -> int:
    """Leading blocks decode may hold: full ones, but not the block of the last prompt token."""
    return (len(prompt) - 1) // LAYOUT.block_size


def test_repeated_prefixes_send_only_missing_blocks(
    policy_cluster: Cluster, shared_prompts: list[list[int]], shared_hf_greedy: list[list[int]]
) -> None:
    prompts, expected = shared_prompts[6:9] * 2, shared_hf_greedy[6:9] * 2
    results = _one_by_one(policy_cluster, prompts)
    assert [tokens for tokens, _ in results] == expected
    for prompt, (_, grown) in zip(prompts, results, strict=True):
        # What traveled and what was saved add up to the prompt's blocks, exactly, and prefill
        # sent exactly what decode received.
        whole = blocks_for(len(prompt), LAYOUT.block_size) * BLOCK_NBYTES
        assert sum(grown.received) + sum(grown.saved) == whole
        assert grown.sent == sum(grown.received)
        assert sum(grown.saved) <= _cacheable(prompt) * BLOCK_NBYTES
    saved = [int(sum(grown.saved)) // BLOCK_NBYTES for _, grown in results]
    workers = {grown.received.index(max(grown.received)) for _, grown in results}
    if policy_cluster.spec.router_args[-1] == "prefix":
        # The first three share six blocks; each repeat finds all its own blocks but the last.
        repeats = [_cacheable(prompt) for prompt in prompts[3:]]
        assert saved == [0, SHARED_BLOCKS, SHARED_BLOCKS, *repeats] and len(workers) == 1
    else:
        assert len(workers) == 2  # spread: a repeat finds its prefix only where it went before
    wait_all_blocks_free(policy_cluster)


def test_cancelled_stream_sharing_a_cached_prefix_frees_every_block(
    policy_cluster: Cluster, shared_prompts: list[list[int]]
) -> None:
    """Both hold the cached prefix (two references); the cancel drops one, the finish the other."""
    received = asyncio.run(cancel_while_sharing(policy_cluster, *shared_prompts[7:9][::-1]))
    assert received >= 3
    wait_all_blocks_free(policy_cluster)
