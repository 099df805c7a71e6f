"""Conditional disaggregation and the colocated deployment through real processes: short prompts
are prefilled on their decode worker, long ones on the prefill tier, with a prefill tier of zero
workers every prompt is local; greedy output equals transformers' in each arm (under structured
constraints too in the colocated one: their grammars compile and run on the decode worker)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from ..structured_cases import CASES
from .conftest import start_cluster
from .helpers import (
    assert_every_case_as_transformers,
    greedy_outputs,
    labelled_metric,
    metric,
    wait_all_blocks_free,
)

pytestmark = pytest.mark.integration

THRESHOLD = 100
PLACEMENTS = "pdserve_router_prefill_placements_total"


def test_conditional_disaggregation_splits_by_prompt_length(
    model_dir: Path,
    tmp_path: Path,
    prompts: list[list[int]],
    hf_greedy: list[list[int]],
    max_new_tokens: int,
) -> None:
    router_args = ("--disagg-threshold", str(THRESHOLD))
    cluster = start_cluster(model_dir, tmp_path / "logs", 1, 1, router_args=router_args)
    try:
        assert asyncio.run(greedy_outputs(cluster, prompts, max_new_tokens)) == hf_greedy
        short = sum(1 for p in prompts if len(p) < THRESHOLD)
        router = cluster.router
        assert labelled_metric(router, PLACEMENTS, place="local", reason="short_prompt") == short
        remote = labelled_metric(router, PLACEMENTS, place="remote", reason="long_prompt")
        assert remote == len(prompts) - short > 0
        local_prefills = metric(cluster.decode[0], "pdserve_decode_local_prefills_total")
        assert local_prefills == short
        wait_all_blocks_free(cluster)
    finally:
        cluster.stop()


def test_colocated_deployment_without_a_prefill_tier(
    model_dir: Path,
    tmp_path: Path,
    prompts: list[list[int]],
    hf_greedy: list[list[int]],
    max_new_tokens: int,
    structured_prompts: list[list[int]],
    structured_reference: list[list[int]],
) -> None:
    cluster = start_cluster(model_dir, tmp_path / "logs", num_prefill=0, num_decode=2)
    try:
        assert asyncio.run(greedy_outputs(cluster, prompts, max_new_tokens)) == hf_greedy
        assert_every_case_as_transformers(cluster, structured_prompts, structured_reference)
        local = labelled_metric(
            cluster.router, PLACEMENTS, place="local", reason="no_prefill_worker"
        )
        assert local == len(prompts) + len(CASES)
        wait_all_blocks_free(cluster)
    finally:
        cluster.stop()
