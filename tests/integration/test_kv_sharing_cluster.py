"""A cluster under `--policy sjf` with a small decode pool: shared prefixes through preemption.

Router + 1 prefill + 1 decode (real processes, UCX), workers started with `--policy sjf` and a
decode pool too small for the whole burst, so decode preempts (swap or recompute) requests while
the prefill tier reuses cached prefixes. Outputs must equal transformers' greedy tokens, and no
block may be left held on either tier.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from pdserve.client import GenerationClient, SamplingParams, build_request
from pdserve.local.cluster import Cluster
from tests.oracle import SHARED_MAX_TOKENS

from .conftest import start_cluster
from .helpers import metric, wait_all_blocks_free

pytestmark = pytest.mark.integration

WORKER_ARGS = ("--policy", "sjf", "--num-kv-blocks", "24", "--num-swap-blocks", "8")


@pytest.fixture(scope="module")
def sjf_cluster(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    logs = tmp_path_factory.mktemp("sjf-cluster-logs")
    cluster = start_cluster(model_dir, logs, 1, 1, worker_args=WORKER_ARGS)
    yield cluster
    cluster.stop()


async def _burst(address: str, prompts: list[list[int]]) -> list[list[int]]:
    sampling = SamplingParams(max_tokens=SHARED_MAX_TOKENS, temperature=0.0)
    async with GenerationClient.connect(address) as client:
        replies = await asyncio.gather(
            *(client.generate(build_request(p, sampling=sampling)) for p in prompts)
        )
    return [list(reply.token_ids) for reply in replies]


def test_shared_prefixes_under_sjf_and_preemption_match_transformers(
    sjf_cluster: Cluster, shared_prompts: list[list[int]], shared_hf_greedy: list[list[int]]
) -> None:
    for _ in range(2):  # the second burst finds the first one's prefixes cached on prefill
        assert asyncio.run(_burst(sjf_cluster.router.address, shared_prompts)) == shared_hf_greedy
        wait_all_blocks_free(sjf_cluster)
    decode, prefill = sjf_cluster.decode[0], sjf_cluster.prefill[0]
    assert metric(decode, "pdserve_decode_preemptions") > 0
    assert metric(prefill, "pdserve_prefill_prefix_cache_hit_tokens") > 0
