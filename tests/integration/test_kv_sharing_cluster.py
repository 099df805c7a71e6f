"""A cluster under `--policy sjf` with small pools: shared prefixes through preemption and KV
offload.

Router + 1 prefill + 1 decode (real processes, UCX), workers started with `--policy sjf`, pools
too small for the whole burst and KV offload tiers below them (a small host tier, a disk tier in
a folder per worker). Decode preempts (swap or recompute) requests while both tiers reuse cached
prefixes, the second burst's largely from below their pools. Outputs must equal transformers'
greedy tokens, and no block may be left held on either tier.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pdserve.client import GenerationClient, SamplingParams, build_request
from pdserve.local.cluster import Cluster
from tests.oracle import SHARED_MAX_TOKENS

from .conftest import start_cluster
from .helpers import labelled_metric, metric, wait_all_blocks_free

pytestmark = pytest.mark.integration

WORKER_ARGS = ("--policy", "sjf", "--num-kv-blocks", "24", "--num-swap-blocks", "8")
# Prefill's pool holds the largest prompt (9 blocks) and little more: it evicts within a burst.
PREFILL_ARGS = ("--num-kv-blocks", "12")
# 2 blocks of the default model in host memory, the rest on disk: both tiers below the pool work.
OFFLOAD_ARGS = ("--kv-offload-host-gb", "0.0015", "--kv-offload-disk-gb", "0.2")


@pytest.fixture(scope="module")
def offload_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("kv-offload")


@pytest.fixture(scope="module")
def sjf_cluster(
    model_dir: Path, tmp_path_factory: pytest.TempPathFactory, offload_folder: Path
) -> Iterator[Cluster]:
    logs = tmp_path_factory.mktemp("sjf-cluster-logs")
    offload = (*OFFLOAD_ARGS, "--kv-offload-disk-path", str(offload_folder))
    cluster = start_cluster(
        model_dir, logs, 1, 1, worker_args=(*WORKER_ARGS, *offload), prefill_args=PREFILL_ARGS
    )
    yield cluster
    cluster.stop()


async def _burst(address: str, prompts: list[list[int]]) -> list[list[int]]:
    sampling = SamplingParams(max_tokens=SHARED_MAX_TOKENS, temperature=0.0)
    async with GenerationClient.connect(address) as client:
        replies = await asyncio.gather(
            *(client.generate(build_request(p, sampling=sampling)) for p in prompts)
        )
    return [list(reply.token_ids) for reply in replies]


def test_shared_prefixes_under_sjf_preemption_and_offload_match_transformers(
    sjf_cluster: Cluster,
    shared_prompts: list[list[int]],
    shared_hf_greedy: list[list[int]],
    offload_folder: Path,
) -> None:
    for _ in range(2):  # the second burst finds the first one's prefixes cached, or below
        assert asyncio.run(_burst(sjf_cluster.router.address, shared_prompts)) == shared_hf_greedy
        wait_all_blocks_free(sjf_cluster)
    decode, prefill = sjf_cluster.decode[0], sjf_cluster.prefill[0]
    assert metric(decode, "pdserve_decode_preemptions") > 0
    assert metric(prefill, "pdserve_prefill_prefix_cache_hit_tokens") > 0
    # Both tiers evicted prefix blocks into their offload tiers and took some back; decode's
    # came from its own tiers instead of traveling from prefill again.
    for worker, tier in ((prefill, "prefill"), (decode, "decode")):
        assert metric(worker, f"pdserve_{tier}_kv_offload_demoted_blocks") > 0
        promoted = [
            labelled_metric(worker, f"pdserve_{tier}_kv_offload_promoted_blocks", level=level)
            for level in ("host", "disk")
        ]
        assert sum(promoted) > 0, tier
        assert (offload_folder / f"{tier}-0").is_dir(), tier  # a folder per worker
    assert metric(decode, "pdserve_decode_kv_reused_blocks") > 0
    # Blocks past the host tier's two were written to disk (by each worker's writer thread).
    deadline = time.monotonic() + 10
    while not any(offload_folder.glob("*/*.kvb")) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert any(offload_folder.glob("*/*.kvb"))
