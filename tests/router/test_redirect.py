"""A prompt still queued for prefill when its decode worker starts to drain follows its
reservation to another decode worker (Prefill.Redirect), over fake tiers: the stream completes
there, the first reservation is aborted, and nothing is prefilled twice. Too late (its KV has
begun to leave), the leaving worker keeps it and the second reservation is aborted."""

from __future__ import annotations

import asyncio
from typing import Any

from pdserve.client import build_request
from pdserve.testing.fake_tiers import FIRST_TOKEN_ID, FakeDecode
from pdserve.v1 import common_pb2

from .conftest import eventually

MAX_TOKENS = 6
EXPECTED = [FIRST_TOKEN_ID, *range(1, MAX_TOKENS)]
QUEUED_S = 1.0  # how long the prompt waits in the (fake) prefill queue


async def _drained_while_queued(stack: Any) -> tuple[list[int], FakeDecode, FakeDecode]:
    """One request whose reservation lands on the first decode worker, which then reports
    that it drains while the prompt still waits in the prefill queue; the request's tokens."""
    leaving, other = stack.tiers.decode
    (prefill,) = stack.tiers.prefill
    prefill.knobs.delay_seconds = QUEUED_S
    other.knobs.load.num_waiting = 100  # the router reserves on the first one
    await stack.registry.poll()
    request = build_request([1, 2, 3], sampling=common_pb2.SamplingParams(max_tokens=MAX_TOKENS))

    async def drain_once_reserved() -> None:
        await eventually(lambda: bool(leaving.reservations))
        leaving.knobs.load.draining = True
        other.knobs.load.num_waiting = 0
        await stack.registry.poll()

    draining = asyncio.ensure_future(drain_once_reserved())
    tokens: list[int] = []
    async for chunk in stack.client.generate_stream(request, timeout=20):
        tokens.extend(chunk.token_ids)
    await draining
    await stack.dispatcher.wait_aborts()
    return tokens, leaving, other


def test_a_queued_prompt_follows_its_reservation_off_a_draining_decode_worker(
    router_stack: Any,
) -> None:
    async def body() -> None:
        async with router_stack(num_decode=2) as stack:
            tokens, leaving, other = await _drained_while_queued(stack)
            (prefill,) = stack.tiers.prefill
            assert tokens == EXPECTED
            (redirect,) = prefill.redirects
            (reserve,) = other.reserves  # its Generate there checked the redirect's token
            request_id = reserve.request.request_id
            assert redirect.request_id == request_id and other.multiplex_calls
            assert len(prefill.calls) == 1  # prefilled once, where it was queued
            assert leaving.aborts == [request_id] and not leaving.reservations
            assert not leaving.multiplex_calls  # nothing streamed from the leaving worker

    asyncio.run(body())


def test_a_prompt_whose_kv_has_begun_to_leave_stays_with_the_draining_worker(
    router_stack: Any,
) -> None:
    async def body() -> None:
        async with router_stack(num_decode=2) as stack:
            (prefill,) = stack.tiers.prefill
            prefill.knobs.redirect_too_late = True
            tokens, leaving, other = await _drained_while_queued(stack)
            assert tokens == EXPECTED
            (redirect,) = prefill.redirects
            assert other.aborts == [redirect.request_id]  # the second reservation, given back
            assert not other.reservations and not other.multiplex_calls
            assert leaving.multiplex_calls  # streamed where its KV went

    asyncio.run(body())


def test_a_draining_decode_worker_is_not_picked(router_stack: Any) -> None:
    async def body() -> None:
        async with router_stack(num_decode=2) as stack:
            leaving, other = stack.tiers.decode
            leaving.knobs.load.draining = True
            other.knobs.load.num_waiting = 100  # busier, but not leaving
            await stack.registry.poll()
            request = build_request([1], sampling=common_pb2.SamplingParams(max_tokens=2))
            async for _ in stack.client.generate_stream(request, timeout=20):
                pass
            assert other.reserves and not leaving.reserves

    asyncio.run(body())


def test_a_prompt_whose_decode_worker_is_lost_starts_over_at_once(router_stack: Any) -> None:
    """Its decode worker dead (Load refused) while the prompt is still in the prefill queue:
    the router does not wait for the KV sender to give up on it (30 s on a real one) but
    cancels the prefill and starts over on the other decode worker."""

    async def body() -> None:
        async with router_stack(num_decode=2) as stack:
            lost, other = stack.tiers.decode
            (prefill,) = stack.tiers.prefill
            prefill.knobs.delay_seconds = 30.0  # the first call's KV never arrives
            other.knobs.load.num_waiting = 100  # the router reserves on the first one
            await stack.registry.poll()
            request = build_request([1, 2, 3], sampling=common_pb2.SamplingParams(max_tokens=4))

            async def lose_once_reserved() -> None:
                await eventually(lambda: bool(lost.reservations))
                lost.knobs.load_fails = True  # a dead process refuses the connection
                prefill.knobs.delay_seconds = 0.0  # the retry's prefill is quick
                await stack.registry.poll()

            losing = asyncio.ensure_future(lose_once_reserved())
            started = asyncio.get_running_loop().time()
            tokens = [
                token
                async for chunk in stack.client.generate_stream(request, timeout=20)
                for token in chunk.token_ids
            ]
            took = asyncio.get_running_loop().time() - started
            await losing
            assert tokens == [FIRST_TOKEN_ID, 1, 2, 3] and took < 5.0
            first_call = prefill.calls[0].request.request_id
            assert len(prefill.calls) == 2 and prefill.cancelled == [first_call]
            assert other.reserves and other.multiplex_calls

    asyncio.run(body())
