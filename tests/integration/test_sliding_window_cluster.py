"""A sliding-window model through real processes: router -> prefill -> UCX -> decode.

The small Mistral of tests/conftest.py (window 32) on one prefill and one decode worker with small
pools (decode preempts: swap and recompute) and the prefix cache on: greedy tokens equal
transformers' for prompts of 1-500 tokens and 48 new ones, twice, and for one prompt sent alone
twice (the second time prefill takes its window from the prefix cache). Decode receives only each
prompt's blocks in the window of its first step, both tiers count the blocks their windows freed,
and nothing is left held.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from pdserve.core.kv.block_pool import blocks_for
from pdserve.core.kv.cache import KVLayout
from pdserve.core.kv.sliding_window import first_live_block
from pdserve.local.cluster import Cluster
from tests.conftest import WINDOW, WINDOW_MAX_TOKENS

from .conftest import start_cluster
from .helpers import greedy_outputs, metric, wait_all_blocks_free

pytestmark = pytest.mark.integration

BLOCK = 16
# 16 blocks: eight sliding sequences of at most 3 blocks each do not fit, so decode preempts;
# 64-token chunks keep a prompt's step within prefill's pool.
SMALL_POOLS = ("--num-kv-blocks", "16", "--num-swap-blocks", "6", "--max-num-batched-tokens", "64")
LAYOUT = KVLayout(num_layers=2, num_kv_heads=2, head_dim=16, block_size=BLOCK, dtype="float32")


@pytest.fixture(scope="module")
def window_cluster(
    window_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    logs = tmp_path_factory.mktemp("window-logs")
    cluster = start_cluster(window_model_dir, logs, 1, 1, worker_args=SMALL_POOLS)
    yield cluster
    cluster.stop()


def test_window_model_through_the_tiers_gives_transformers_tokens(
    window_cluster: Cluster, prompts: list[list[int]], window_hf_greedy: list[list[int]]
) -> None:
    for _ in range(2):
        served = asyncio.run(greedy_outputs(window_cluster, prompts, WINDOW_MAX_TOKENS))
        assert served == window_hf_greedy
        wait_all_blocks_free(window_cluster)
    prefill, decode = window_cluster.prefill[0], window_cluster.decode[0]
    assert metric(decode, "pdserve_decode_preemptions") > 0
    # A burst's eight prompts evict each other from prefill's 16 blocks in an order the scheduling
    # decides, so whether a burst hits is timing; one prompt sent alone twice must hit.
    hits_before = metric(prefill, "pdserve_prefill_prefix_cache_hit_tokens")
    for _ in range(2):
        served = asyncio.run(greedy_outputs(window_cluster, [prompts[6]], WINDOW_MAX_TOKENS))
        assert served == [window_hf_greedy[6]]
        wait_all_blocks_free(window_cluster)
    assert metric(prefill, "pdserve_prefill_prefix_cache_hit_tokens") > hits_before
    assert metric(prefill, "pdserve_prefill_sliding_window_freed_blocks") > 0
    assert metric(decode, "pdserve_decode_sliding_window_freed_blocks") > 0


def test_only_the_prompts_window_crosses_ucx(
    window_cluster: Cluster, prompts: list[list[int]]
) -> None:
    """A 500-token prompt no earlier test sent: 3 of its 32 blocks travel (positions 464-499)."""
    prompt = prompts[-1][::-1]
    received = "pdserve_decode_kv_received_bytes"
    before = metric(window_cluster.decode[0], received)
    asyncio.run(greedy_outputs(window_cluster, [prompt], 2))
    in_window = blocks_for(len(prompt), BLOCK) - first_live_block(len(prompt), WINDOW, BLOCK)
    assert in_window == 3
    assert metric(window_cluster.decode[0], received) - before == in_window * LAYOUT.block_nbytes
    wait_all_blocks_free(window_cluster)
