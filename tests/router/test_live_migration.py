"""The router's live migration off a draining decode worker, over fake tiers (real grpc.aio on
127.0.0.1), each branch of router/live_migration.py: the move (Suspend, Reserve on the other
worker, Migrate, Generate there), and each failure on the way (the target refuses the
reservation, the push fails or the source is gone, the client cancels during the move). A move
that fails re-prefills the stream elsewhere: the client still gets every token, and neither
decode worker keeps anything for the request."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest
from prometheus_client import REGISTRY

from pdserve.client import build_request
from pdserve.testing.fake_tiers import FIRST_TOKEN_ID, Failure, FakeDecode
from pdserve.v1 import common_pb2

MAX_TOKENS = 12
DRAINING_AFTER = 3  # the source's deltas say it drains from its fourth token on
# A crash-style re-prefill restarts the fake's count after the streamed tokens; the live move
# continues it. Either way the client gets MAX_TOKENS tokens and the fake's last usage.
LIVE = [FIRST_TOKEN_ID, *range(1, MAX_TOKENS)]


def _request() -> Any:
    return build_request([5, 6, 7], sampling=common_pb2.SamplingParams(max_tokens=MAX_TOKENS))


def _migrations(outcome: str) -> float:
    labels = {"outcome": outcome}
    return REGISTRY.get_sample_value("pdserve_router_migrations_total", labels) or 0.0


async def _draining_source(stack: Any) -> tuple[FakeDecode, FakeDecode]:
    """decode-0 takes the stream and drains from DRAINING_AFTER on; decode-1 reports itself
    busy, so the first pick is decode-0 and only a move sends the stream to decode-1."""
    source, target = stack.tiers.decode
    source.knobs.draining_after_tokens = DRAINING_AFTER
    source.knobs.step_seconds = target.knobs.step_seconds = 0.02
    target.knobs.load.num_running, target.knobs.load.num_context_tokens = 8, 800
    await stack.registry.poll()
    return source, target


def _nothing_held(*workers: FakeDecode) -> bool:
    return all(not worker.reservations for worker in workers)


def test_a_draining_workers_stream_moves_with_its_kv(router_stack: Any) -> None:
    async def body() -> None:
        async with router_stack(num_decode=2) as stack:
            source, target = await _draining_source(stack)
            live_before = _migrations("live")
            reply = await stack.client.generate(_request(), timeout=10)
            assert list(reply.token_ids) == LIVE  # continued, nothing repeated or lost
            assert reply.usage.completion_tokens == MAX_TOKENS
            assert _migrations("live") == live_before + 1
            (moved,) = [r for r in target.reserves if r.live_migration]
            assert source.migrated == [moved.request.request_id]
            streamed = list(moved.request.resumed_output_token_ids)
            assert streamed == LIVE[: len(streamed)] and len(streamed) >= DRAINING_AFTER
            await stack.dispatcher.wait_aborts()
            assert _nothing_held(source, target)

    asyncio.run(body())


@pytest.mark.parametrize(
    "failing",
    ["target_refuses_the_reservation", "migrate_fails", "source_gone_during_the_push"],
)
def test_a_move_that_fails_re_prefills_and_leaves_nothing_held(
    router_stack: Any, failing: str
) -> None:
    async def body() -> None:
        async with router_stack(num_decode=2) as stack:
            source, target = await _draining_source(stack)
            if failing == "target_refuses_the_reservation":
                refused = Failure(grpc.StatusCode.RESOURCE_EXHAUSTED, "no free blocks")
                target.knobs.failures = [refused]
            elif failing == "migrate_fails":
                source.knobs.migrate_failure = Failure(grpc.StatusCode.INTERNAL, "push failed")
            else:
                source.knobs.migrate_failure = Failure(grpc.StatusCode.UNAVAILABLE, "gone")
            live_before = _migrations("live")
            reply = await stack.client.generate(_request(), timeout=10)
            tokens = list(reply.token_ids)
            assert len(tokens) == MAX_TOKENS and tokens[:DRAINING_AFTER] == LIVE[:DRAINING_AFTER]
            assert reply.usage.completion_tokens == MAX_TOKENS
            assert _migrations("live") == live_before  # not moved live: re-prefilled
            assert not source.migrated
            await stack.dispatcher.wait_aborts()
            request_id = target.reserves[0].request.request_id
            assert request_id in source.aborts  # the suspended request freed on the source
            if failing != "target_refuses_the_reservation":  # a reservation was made there
                assert request_id in target.aborts
            assert _nothing_held(source, target)

    asyncio.run(body())


def test_a_cancel_during_the_move_aborts_both_sides(router_stack: Any) -> None:
    async def body() -> None:
        async with router_stack(num_decode=2) as stack:
            source, target = await _draining_source(stack)
            source.knobs.migrate_seconds = 5.0  # the push is under way when the client leaves
            call = asyncio.ensure_future(stack.client.generate(_request(), timeout=10))
            while not target.reserves:
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.1)  # Migrate has been sent
            call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await call
            request_id = target.reserves[0].request.request_id
            deadline = asyncio.get_running_loop().time() + 5.0  # the router sees the cancel
            while not (request_id in source.aborts and request_id in target.aborts):
                assert asyncio.get_running_loop().time() < deadline, "no Abort on both sides"
                await asyncio.sleep(0.01)
            await stack.dispatcher.wait_aborts()
            assert _nothing_held(source, target)
            assert not source.migrated  # the push was cut short

    asyncio.run(body())
