"""Adaptive placement through real processes (1 prefill + 1 decode worker, both stepping under an
ITL SLO on each stream's mean gap): a request on an idle pair stays on its decode worker; with a
stream running there, the idle prefill worker is lent streams and runs requests end to end; once
its streams are done it is taken back, and lent again. Greedy output equals transformers' every
way, and every worker's blocks are free afterwards."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from pdserve.client import GenerationClient, SamplingParams, build_request
from pdserve.local.cluster import Cluster, Process
from pdserve.router.placement.prefill_place import PlacementReason
from tests.fakes import PROFILE_OTHER_HOST

from .conftest import WORKER_ARGS, start_cluster
from .helpers import greedy_outputs, labelled_metric, metric, wait_all_blocks_free

pytestmark = pytest.mark.integration

POLL_S = 0.2
COST_MODEL = ("--profile", str(PROFILE_OTHER_HOST), "--itl-slo", "0.3")
# The router's ITL SLO is one no decode step meets, so that decode never keeps a new stream
# within it and the idle prefill worker may be lent: under a 0.3 s SLO decode takes the streams
# itself (router/placement/adaptive.py lends only when it cannot; tests/router checks that).
ROUTER_ARGS = (
    *("--placement", "adaptive", "--profile", str(PROFILE_OTHER_HOST), "--itl-slo", "0.001"),
    *("--load-poll-interval-seconds", str(POLL_S)),
)
PLACEMENTS = "pdserve_router_prefill_placements_total"
ROLE_CHANGES = "pdserve_router_role_changes_total"
LOCAL_PREFILLS = "pdserve_decode_local_prefills_total"
TTFT_RATIO = "pdserve_router_ttft_prediction_ratio_count"
STREAM_TOKENS = 40
# Bursts sent until the prefill worker is lent again. Three were not always enough (the suite
# runs at 924a449 and 5dfb19d): a burst whose stream found decode still counted busy went remote
# and kept the prefill worker prefilling, so nothing could be lent; the next burst lent it.
LEND_AGAIN_TRIES = 5


async def _beside_a_stream(
    cluster: Cluster, stream_prompt: list[int], prompts: list[list[int]], max_tokens: int
) -> tuple[int, list[list[int]]]:
    """Streams `stream_prompt` (placed first, on the idle pair's decode worker); once its first
    token came and the router polled, sends every prompt at once. Returns the stream's token
    count and the prompts' greedy outputs."""
    endless = SamplingParams(max_tokens=STREAM_TOKENS, temperature=0.0, ignore_eos=True)
    received = 0
    outputs: list[list[int]] = []
    async with GenerationClient.connect(cluster.router.address) as client:
        stream = client.generate_stream(build_request(stream_prompt, sampling=endless))
        async for chunk in stream:
            if received == 0:
                await asyncio.sleep(2 * POLL_S)  # the router sees the stream in decode's Load
                outputs = await greedy_outputs(cluster, prompts, max_tokens)
            received += len(chunk.token_ids)
    return received, outputs


def test_adaptive_placement_lends_the_prefill_worker_and_takes_it_back(
    model_dir: Path,
    tmp_path: Path,
    prompts: list[list[int]],
    hf_greedy: list[list[int]],
    max_new_tokens: int,
) -> None:
    # The workers bound each stream's mean gap (the SLO a TPOT target judges); greedy output
    # must not depend on how a step's prompt tokens were capped.
    worker_args = (*WORKER_ARGS, *COST_MODEL, "--itl-slo-mode", "mean")
    cluster = start_cluster(
        model_dir, tmp_path / "logs", 1, 1, router_args=ROUTER_ARGS, worker_args=worker_args
    )
    try:
        router, prefill, decode = cluster.router, cluster.prefill[0], cluster.decode[0]
        # An idle pair: the prompt stays where it decodes (no hand-off).
        alone = asyncio.run(greedy_outputs(cluster, prompts[:1], max_new_tokens))
        assert alone == hf_greedy[:1]
        assert labelled_metric(router, PLACEMENTS, place="local", reason="local_cheaper") == 1
        assert metric(decode, LOCAL_PREFILLS) == 1
        # Its TTFT over the placement's prediction, in the router's histogram.
        assert labelled_metric(router, TTFT_RATIO, place="local") == 1

        # A stream runs on decode: the idle prefill worker is lent (mid-run) and decodes too.
        received, outputs = asyncio.run(
            _beside_a_stream(cluster, prompts[0], prompts, max_new_tokens)
        )
        assert received == STREAM_TOKENS
        assert outputs == hf_greedy
        assert labelled_metric(router, ROLE_CHANGES, role="decode") >= 1
        assert labelled_metric(router, PLACEMENTS, place="local", reason="prefill_idle") >= 1
        assert metric(prefill, LOCAL_PREFILLS) >= 1
        wait_all_blocks_free(cluster)

        # Its streams done, it is taken back at the next decision, then lent again.
        asyncio.run(asyncio.sleep(2 * POLL_S))
        # Whether one burst lends it hangs on the decisions' timing against the measured steps
        # (the short prompts are as cheap prefilled beside the stream on decode itself): up to
        # LEND_AGAIN_TRIES bursts, each with transformers' outputs, until it is lent again.
        for _ in range(LEND_AGAIN_TRIES):
            again = asyncio.run(_beside_a_stream(cluster, prompts[1], prompts, max_new_tokens))
            assert again == (STREAM_TOKENS, hf_greedy)
            if labelled_metric(router, ROLE_CHANGES, role="decode") >= 2:
                break
            wait_all_blocks_free(cluster)
        assert labelled_metric(router, ROLE_CHANGES, role="prefill") >= 1
        assert labelled_metric(router, ROLE_CHANGES, role="decode") >= 2
        wait_all_blocks_free(cluster)
        # Every request placed, in the histogram by where its prompt was prefilled.
        for place in ("local", "remote"):
            assert labelled_metric(router, TTFT_RATIO, place=place) == _placed(router, place)
    finally:
        cluster.stop()


def _placed(router: Process, place: str) -> float:
    """Requests adaptive placement prefilled at `place`, summed over its reasons."""
    reasons = [reason.value for reason in PlacementReason]
    return sum(labelled_metric(router, PLACEMENTS, place=place, reason=r) for r in reasons)
