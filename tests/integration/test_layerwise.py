"""Layer-wise KV push through real processes: decode asks for the KV in 4 pieces (groups of the
model's layers), prefill pushes each group as soon as its forward pass wrote it; greedy output
equals transformers' and every block is free afterwards on both tiers."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from .conftest import WORKER_ARGS, start_cluster
from .helpers import greedy_outputs, metric, wait_all_blocks_free

pytestmark = pytest.mark.integration

LAYER_GROUPS = 4


def test_layerwise_push_gives_transformers_greedy_output_and_frees_every_block(
    model_dir: Path,
    tmp_path: Path,
    prompts: list[list[int]],
    hf_greedy: list[list[int]],
    max_new_tokens: int,
) -> None:
    # Chunked prefill on (a small token budget): long prompts complete in a later step than
    # their first chunk, and only the completing step pushes.
    cluster = start_cluster(
        model_dir,
        tmp_path / "logs",
        1,
        1,
        worker_args=(*WORKER_ARGS, "--max-num-batched-tokens", "64"),
        env=(("PDSERVE_KV_LAYER_GROUPS", str(LAYER_GROUPS)),),
    )
    try:
        assert asyncio.run(greedy_outputs(cluster, prompts, max_new_tokens)) == hf_greedy
        wait_all_blocks_free(cluster)
        pieces = metric(cluster.prefill[0], "pdserve_prefill_kv_sent_pieces")
        assert pieces == LAYER_GROUPS * len(prompts)
    finally:
        cluster.stop()
