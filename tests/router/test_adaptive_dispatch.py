"""The router following `--placement adaptive` over fake tiers whose loads the tests set: each
choice reaches the worker it names, a prefill worker is lent streams and taken back, and every
decision is counted with its reason."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from prometheus_client import REGISTRY

from pdserve.client import build_request
from pdserve.costmodel.output_length import MIN_FINISHED
from pdserve.costmodel.profile import BlockCosts, CostModel, Profile
from pdserve.costmodel.step_budget import StepCosts
from pdserve.router.placement.prefill_place import PlacementMode
from pdserve.testing.fake_tiers import FIRST_TOKEN_ID
from pdserve.v1 import common_pb2

# 50 ms a step, 1 ms a prompt token, 5 ms a decoding stream; the KV crosses for free.
COSTS = StepCosts(
    Profile(CostModel((0.05, 0.001, 0.0, 0.005, 0.0)), BlockCosts(1, 0, 0, 0, 1e30), 16), 2048
)
ADAPTIVE = {"placement_mode": PlacementMode.ADAPTIVE, "costs": COSTS}
SAMPLING = common_pb2.SamplingParams(max_tokens=3)


def _counted(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(f"pdserve_router_{name}_total", labels) or 0.0


def _busy(load: common_pb2.LoadResponse, running: int = 0, pending: int = 0) -> None:
    load.num_running, load.num_context_tokens = running, running * 100
    load.num_waiting, load.num_pending_prompt_tokens = int(pending > 0), pending


def test_an_idle_pair_prefills_on_the_decode_worker(router_stack: Any) -> None:
    async def body() -> None:
        async with router_stack(**ADAPTIVE) as stack:
            before = _counted("prefill_placements", place="local", reason="local_cheaper")
            reply = await stack.client.generate(build_request([1] * 20, sampling=SAMPLING))
            assert list(reply.token_ids) == [0, 1, 2]  # the fake's local first token is 0
            assert len(stack.tiers.decode[0].local_requests) == 1
            assert not stack.tiers.prefill[0].calls and not stack.tiers.lent[0].local_requests
            after = _counted("prefill_placements", place="local", reason="local_cheaper")
            assert after == before + 1

    asyncio.run(body())


def test_at_debug_level_each_placement_is_logged_with_its_prices(
    router_stack: Any, caplog: pytest.LogCaptureFixture
) -> None:
    async def body() -> None:
        async with router_stack(**ADAPTIVE) as stack:
            request = build_request([1] * 20, sampling=SAMPLING)
            request.request_id = "client-7"
            await stack.client.generate(request)

    with caplog.at_level(logging.DEBUG, logger="pdserve.router.dispatch"):
        asyncio.run(body())
    placed = [r.getMessage() for r in caplog.records if r.getMessage().startswith("placed ")]
    assert len(placed) == 1
    assert "client id 'client-7'" in placed[0]
    assert "20 prompt tokens" in placed[0] and "local (local_cheaper)" in placed[0]
    assert "predicted ttft" in placed[0]


def test_a_long_prompt_beside_busy_streams_goes_to_the_busy_prefill_tier(
    router_stack: Any,
) -> None:
    """Decode runs 20 streams; the prefill worker is prefilling a short prompt (so it is not
    lent). Prefilling 400 tokens locally would stall the 20 streams: remote."""

    async def body() -> None:
        async with router_stack(**ADAPTIVE) as stack:
            _busy(stack.tiers.decode[0].knobs.load, running=20)
            _busy(stack.tiers.prefill[0].knobs.load, pending=10)
            await stack.registry.poll()
            before = _counted("prefill_placements", place="remote", reason="spares_streams")
            reply = await stack.client.generate(build_request([1] * 400, sampling=SAMPLING))
            assert list(reply.token_ids) == [FIRST_TOKEN_ID, 1, 2]
            assert [
                len(call.request.prompt_token_ids) for call in stack.tiers.prefill[0].calls
            ] == [400]
            after = _counted("prefill_placements", place="remote", reason="spares_streams")
            assert after == before + 1

    asyncio.run(body())


def test_an_idle_prefill_worker_is_lent_streams_and_taken_back(router_stack: Any) -> None:
    async def body() -> None:
        async with router_stack(**ADAPTIVE) as stack:
            decode, lent = stack.tiers.decode[0], stack.tiers.lent[0]
            address = stack.tiers.prefill_addresses[0]
            _busy(decode.knobs.load, running=20)
            await stack.registry.poll()
            lent_before = _counted("role_changes", role="decode")
            back_before = _counted("role_changes", role="prefill")

            reply = await stack.client.generate(build_request([1] * 20, sampling=SAMPLING))
            assert list(reply.token_ids) == [0, 1, 2]
            assert len(lent.local_requests) == 1 and not decode.local_requests
            assert stack.registry.decode.borrowed == {address}
            assert _counted("role_changes", role="decode") == lent_before + 1
            reason = {"place": "local", "reason": "prefill_idle"}
            assert _counted("prefill_placements", **reason) >= 1

            await stack.registry.poll()  # the lent worker reports no stream left
            await stack.client.generate(build_request([1] * 20, sampling=SAMPLING))
            assert _counted("role_changes", role="prefill") == back_before + 1
            assert len(lent.local_requests) == 2  # idle again: lent again

    asyncio.run(body())


def test_reserve_never_goes_to_a_lent_worker(router_stack: Any) -> None:
    """A lent prefill worker cannot receive KV: a retried Reserve picks the decode tier only."""

    async def body() -> None:
        async with router_stack(**ADAPTIVE) as stack:
            stack.dispatcher.roles.decode_worker(stack.tiers.prefill_addresses[0])
            pool = stack.registry.decode
            for _ in range(4):
                assert pool.pick(own=True).address == stack.tiers.decode_addresses[0]

    asyncio.run(body())


def test_finished_streams_teach_the_router_how_long_such_streams_run(router_stack: Any) -> None:
    """Eight requests asking for up to 3 tokens end at 3 (by length): a request asking for up
    to 4 (the same group of limits) is then priced at 3 tokens of decode, not at its limit.
    Streams cancelled after one token teach nothing (counted, they would bring it down to 2)."""

    async def body() -> None:
        async with router_stack(**ADAPTIVE) as stack:
            lengths = stack.dispatcher.output_lengths
            for _ in range(MIN_FINISHED):
                assert lengths.remaining(4) == 4
                await stack.client.generate(build_request([1] * 20, sampling=SAMPLING))
            assert lengths.remaining(4) == 3
            stack.tiers.decode[0].knobs.delay_seconds = 0.2

            async def cancelled_after_one_token() -> None:
                sampling = common_pb2.SamplingParams(max_tokens=4)
                call = stack.client.generate_stream(build_request([1] * 20, sampling=sampling))
                async for _ in call:
                    break  # leaving the loop cancels the call

            await asyncio.gather(*(cancelled_after_one_token() for _ in range(MIN_FINISHED)))
            assert lengths.remaining(4) == 3

    asyncio.run(body())
