"""Where prompts are prefilled (the rule, and the router following it over fake tiers) and
migration off a decode worker whose stream breaks."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest
from prometheus_client import REGISTRY

from pdserve.client import build_request
from pdserve.router.placement.prefill_place import (
    Placement,
    PlacementReason,
    PrefillPlace,
    PrefillTierState,
    place_prefill,
)
from pdserve.testing.fake_tiers import FIRST_TOKEN_ID
from pdserve.v1 import common_pb2

LOCAL, REMOTE = PrefillPlace.LOCAL, PrefillPlace.REMOTE


@pytest.mark.parametrize(
    ("prompt", "threshold", "healthy", "in_flight", "expected"),
    [
        (10, 0, 0, 0, Placement(LOCAL, PlacementReason.NO_PREFILL_WORKER)),
        (10, 0, 2, 99, Placement(REMOTE, PlacementReason.ALWAYS_REMOTE)),
        (99, 100, 1, 0, Placement(LOCAL, PlacementReason.SHORT_PROMPT)),
        (100, 100, 1, 3, Placement(REMOTE, PlacementReason.LONG_PROMPT)),
        (100, 100, 1, 4, Placement(LOCAL, PlacementReason.PREFILL_SATURATED)),
        (100, 100, 2, 7, Placement(REMOTE, PlacementReason.LONG_PROMPT)),
        (10**6, 10**9, 1, 0, Placement(LOCAL, PlacementReason.SHORT_PROMPT)),  # colocated
    ],
)
def test_placement_rule(
    prompt: int, threshold: int, healthy: int, in_flight: int, expected: Placement
) -> None:
    tier = PrefillTierState(healthy_workers=healthy, in_flight=in_flight)
    assert place_prefill(prompt, threshold, max_queue_per_worker=4, tier=tier) == expected


def _placements(place: str, reason: str) -> float:
    labels = {"place": place, "reason": reason}
    return REGISTRY.get_sample_value("pdserve_router_prefill_placements_total", labels) or 0.0


def test_short_prompts_are_prefilled_on_decode_and_long_ones_on_the_prefill_tier(
    router_stack: Any,
) -> None:
    async def body() -> None:
        async with router_stack(disagg_threshold=8) as stack:
            short_before = _placements("local", "short_prompt")
            long_before = _placements("remote", "long_prompt")
            sampling = common_pb2.SamplingParams(max_tokens=3)
            short = await stack.client.generate(build_request([1] * 7, sampling=sampling))
            long = await stack.client.generate(build_request([1] * 8, sampling=sampling))
            assert list(short.token_ids) == [0, 1, 2]  # the fake's local first token is 0
            assert list(long.token_ids) == [FIRST_TOKEN_ID, 1, 2]
            decode, prefill = stack.tiers.decode[0], stack.tiers.prefill[0]
            assert [len(r.request.prompt_token_ids) for r in decode.local_requests] == [7]
            assert [len(r.request.prompt_token_ids) for r in prefill.calls] == [8]
            assert _placements("local", "short_prompt") == short_before + 1
            assert _placements("remote", "long_prompt") == long_before + 1

    asyncio.run(body())


def test_a_lost_decode_stream_migrates_without_repeating_or_skipping(router_stack: Any) -> None:
    async def body() -> None:
        async with router_stack(num_decode=2) as stack:
            first, second = stack.tiers.decode
            first.knobs.lost_after_tokens = 3
            second.knobs.load.num_waiting = 1  # the router starts on the first
            await stack.registry.poll()
            request = build_request([5, 6], sampling=common_pb2.SamplingParams(max_tokens=8))
            chunks = [c async for c in stack.client.generate_stream(request, timeout=10)]
            tokens = [t for chunk in chunks for t in chunk.token_ids]
            # 3 from the first worker, then a run of the remaining 5 on the second.
            assert tokens == [FIRST_TOKEN_ID, 1, 2, FIRST_TOKEN_ID, 1, 2, 3, 4]
            continued = second.reserves[-1].request
            assert list(continued.prompt_token_ids) == [5, 6]
            assert list(continued.resumed_output_token_ids) == [FIRST_TOKEN_ID, 1, 2]
            assert continued.sampling.max_tokens == 8
            assert chunks[-1].usage == common_pb2.Usage(prompt_tokens=2, completion_tokens=8)

    asyncio.run(body())


def test_no_decode_worker_left_ends_unavailable_naming_the_lost_one(router_stack: Any) -> None:
    async def body() -> None:
        async with router_stack(num_decode=1) as stack:
            decode = stack.tiers.decode[0]
            decode.knobs.lost_after_tokens = 2
            request = build_request([5], sampling=common_pb2.SamplingParams(max_tokens=8))
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await stack.client.generate(request, timeout=10)
            assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
            assert stack.tiers.decode_addresses[0] in (caught.value.details() or "")
            assert "lost after 2 tokens" in (caught.value.details() or "")

    asyncio.run(body())
